//! The projections an adapter can target, by PEFT's module names, and where each sits in
//! a layer of a given model: its block in the checkpoint names and its shape, or why the
//! layer has none.

use met_config::ModelConfig;

/// A projection an adapter can target: met's own projections, each named after the PEFT
/// module whose rows it holds (a PEFT module met splits, such as gated attention's doubled
/// `q_proj` or Qwen3-Next's grouped `in_proj_qkvz`, is several of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraModule {
    /// `self_attn.q_proj`: the queries (gated attention's doubled `q_proj` holds its
    /// output gate too, [`Self::QGate`]).
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`, or the shared expert's beside routed experts.
    Gate,
    /// `mlp.up_proj`, or the shared expert's.
    Up,
    /// `mlp.down_proj`, or the shared expert's.
    Down,
    /// The output-gate half of gated attention's `q_proj` (`self_attn.q_gate` in met).
    QGate,
    /// `linear_attn.in_proj_qkv`: a Gated DeltaNet layer's queries, keys and values.
    LinQkv,
    /// `linear_attn.in_proj_z`: its output gate.
    LinZ,
    /// `linear_attn.in_proj_b`: its delta rule's β.
    LinB,
    /// `linear_attn.in_proj_a`: its delta rule's decay.
    LinA,
    /// `linear_attn.out_proj`.
    LinOut,
    /// `mlp.shared_expert_gate`: the shared expert's one-column gate.
    SharedGate,
    /// `mlp.gate`: the router of a layer of routed experts.
    Router,
}

/// How many modules there are.
pub(crate) const MODULES: usize = LoraModule::ALL.len();

impl LoraModule {
    /// Every module, in the order of the per-layer arrays.
    pub const ALL: [Self; 15] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
        Self::QGate,
        Self::LinQkv,
        Self::LinZ,
        Self::LinB,
        Self::LinA,
        Self::LinOut,
        Self::SharedGate,
        Self::Router,
    ];

    /// The module's name in met's canonical tensor names (`self_attn.q_gate`), which is
    /// PEFT's name for it where PEFT has one.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
            Self::QGate => "q_gate",
            Self::LinQkv => "in_proj_qkv",
            Self::LinZ => "in_proj_z",
            Self::LinB => "in_proj_b",
            Self::LinA => "in_proj_a",
            Self::LinOut => "out_proj",
            Self::SharedGate => "shared_expert_gate",
            Self::Router => "gate",
        }
    }

    /// Its position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|&m| m == self).expect("every module is in ALL")
    }

    /// The module named `name` in met's canonical tensor names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The block holding it in layer `layer`'s checkpoint names: a layer routing experts
    /// has its MLP modules in its shared expert.
    pub(crate) fn block(self, cfg: &ModelConfig, layer: usize) -> &'static str {
        match self {
            Self::Q | Self::K | Self::V | Self::O | Self::QGate => "self_attn",
            Self::LinQkv | Self::LinZ | Self::LinB | Self::LinA | Self::LinOut => "linear_attn",
            Self::SharedGate | Self::Router => "mlp",
            _ if sparse(cfg, layer) => "mlp.shared_expert",
            _ => "mlp",
        }
    }

    /// `(in, out)` of this projection in layer `layer` of `cfg`, or why it has none.
    pub(crate) fn shape(self, cfg: &ModelConfig, layer: usize) -> Result<(usize, usize), String> {
        let (h, q, kv) = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let linear = cfg.linear_attention.as_ref().filter(|l| l.is_linear(layer));
        let moe = cfg.moe.as_ref().filter(|_| sparse(cfg, layer));
        let shared = moe.and_then(|m| m.shared_expert_intermediate_size);
        let none = |what: &str| format!("layer {layer} has no {}.{} ({what})", self.block(cfg, layer), self.name());
        match self {
            Self::Q | Self::K | Self::V | Self::O | Self::QGate if linear.is_some() => {
                Err(none("a linear-attention layer"))
            }
            Self::Q => Ok((h, q)),
            Self::K | Self::V => Ok((h, kv)),
            Self::O => Ok((q, h)),
            Self::QGate if cfg.attn_output_gate => Ok((h, q)),
            Self::QGate => Err(none("its attention has no output gate")),
            Self::LinQkv | Self::LinZ | Self::LinB | Self::LinA | Self::LinOut => match linear {
                Some(la) => Ok(match self {
                    Self::LinQkv => (h, la.conv_dim()),
                    Self::LinZ => (h, la.value_dim()),
                    Self::LinOut => (la.value_dim(), h),
                    _ => (h, la.num_value_heads),
                }),
                None => Err(none("not a linear-attention layer")),
            },
            Self::Router => moe.map(|m| (h, m.num_experts)).ok_or_else(|| none("it routes no experts")),
            Self::SharedGate => shared.map(|_| (h, 1)).ok_or_else(|| none("it has no shared expert")),
            _ if moe.is_some() => match shared {
                Some(s) if self == Self::Down => Ok((s, h)),
                Some(s) => Ok((h, s)),
                None => Err(none(
                    "it routes experts: adapters on them name `mlp.experts.{e}.<module>` or the `mlp.experts` \
                     parameters",
                )),
            },
            Self::Gate | Self::Up => Ok((h, cfg.intermediate_size)),
            Self::Down => Ok((cfg.intermediate_size, h)),
        }
    }
}

/// Whether layer `layer` of `cfg` routes experts.
fn sparse(cfg: &ModelConfig, layer: usize) -> bool {
    cfg.moe.as_ref().is_some_and(|m| m.sparse_layers.get(layer).copied().unwrap_or(false))
}
