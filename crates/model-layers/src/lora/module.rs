//! The projections an adapter can target, by PEFT's module names, and where each sits in
//! a layer of a given model: its block in the checkpoint names and its shape, or why the
//! layer has none.

use met_config::ModelConfig;

/// A projection an adapter can target, by PEFT's module name.
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
    /// The output-gate half of gated attention's `q_proj`, which met computes as a
    /// projection of its own: an adapter's `q_proj` delta is split between it and `Q`.
    QGate,
}

/// How many modules there are.
pub(crate) const MODULES: usize = LoraModule::ALL.len();

impl LoraModule {
    /// Every module, in the order of the per-layer arrays.
    pub const ALL: [Self; 8] = [Self::Q, Self::K, Self::V, Self::O, Self::Gate, Self::Up, Self::Down, Self::QGate];

    /// The modules PEFT names (all but the gate half of a doubled `q_proj`).
    pub const NAMED: [Self; 7] = [Self::Q, Self::K, Self::V, Self::O, Self::Gate, Self::Up, Self::Down];

    /// PEFT's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q | Self::QGate => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }

    /// Its position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|&m| m == self).expect("every module is in ALL")
    }

    /// The module PEFT calls `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED.into_iter().find(|m| m.name() == name)
    }

    /// The block holding it in layer `layer`'s checkpoint names: a layer routing experts
    /// has its MLP modules in its shared expert.
    pub(crate) fn block(self, cfg: &ModelConfig, layer: usize) -> &'static str {
        match self {
            Self::Q | Self::K | Self::V | Self::O | Self::QGate => "self_attn",
            _ if sparse(cfg, layer) => "mlp.shared_expert",
            _ => "mlp",
        }
    }

    /// `(in, out)` of this projection in layer `layer` of `cfg`, or why it has none.
    pub(crate) fn shape(self, cfg: &ModelConfig, layer: usize) -> Result<(usize, usize), String> {
        let (h, q, kv) = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let linear = cfg.linear_attention.as_ref().is_some_and(|l| l.is_linear(layer));
        let shared = cfg.moe.as_ref().and_then(|m| m.shared_expert_intermediate_size);
        match self {
            Self::Q | Self::K | Self::V | Self::O | Self::QGate if linear => Err(format!(
                "layer {layer} is a linear-attention layer, without {}; met applies no adapters to its projections",
                self.name()
            )),
            Self::Q => Ok((h, q)),
            Self::K | Self::V => Ok((h, kv)),
            Self::O => Ok((q, h)),
            Self::QGate if cfg.attn_output_gate => Ok((h, q)),
            Self::QGate => Err(format!("layer {layer}'s attention has no output gate")),
            _ if sparse(cfg, layer) => match shared {
                Some(s) if self == Self::Down => Ok((s, h)),
                Some(s) => Ok((h, s)),
                None => Err(format!(
                    "layer {layer} routes experts: it has no dense {}; adapters on its experts name \
                     `mlp.experts.{{e}}.{}` or the `mlp.experts` parameters",
                    self.name(),
                    self.name()
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
