//! A checkpoint seen under met's canonical tensor names.
//!
//! Some checkpoints store the tensors a layer reads in another arrangement than the one
//! met's layers declare: a vision-language checkpoint keeps its text model under
//! `model.language_model.`, Qwen3.5-MoE stacks its experts into `experts.gate_up_proj`
//! `[e, 2i, h]` and `experts.down_proj` `[e, h, i]`, gated attention interleaves each
//! head's query rows with its gate rows in `q_proj`, and Qwen3-Next groups a Gated
//! DeltaNet layer's q/k/v/z (and b/a) projection rows per key head. The view presents each
//! as the canonical tensors (`model.`, `experts.{e}.gate_proj`, `q_proj` + `q_gate`,
//! `in_proj_qkv` + `in_proj_z` + `in_proj_b` + `in_proj_a`), each a selection of rows of
//! one stored tensor, so the layers and the preflight know one layout only. A row
//! selection that is one run stays borrowed from the memory map; others are copied once,
//! at load.
//!
//! A store that already holds canonical names (dummy weights) passes through. A GGUF
//! store serves a hybrid under the checkpoint's names, gated `q_proj` and Qwen3-Next's
//! grouped `in_proj_ba` included, which the view maps as it maps a checkpoint's.
//! Tensors outside the text model (`model.visual.*`) are not listed: met serves the text.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use met_config::{GdnProjections, ModelConfig};
use met_kernels::HostTensor;
use met_model_weights::{TensorInfo, WeightError, WeightStore};

/// Where a canonical tensor's rows come from.
#[derive(Debug, Clone)]
struct Selection {
    /// The stored tensor.
    source: String,
    /// Rows of the stored tensor viewed as 2-D `[rows, last dim]`, concatenated; empty
    /// for the whole tensor as stored (a renamed one).
    rows: Vec<Range<usize>>,
    /// The canonical shape.
    shape: Vec<usize>,
}

/// `inner` under canonical names ([`canonical`]).
pub(crate) struct CheckpointView<'a> {
    inner: &'a dyn WeightStore,
    /// Canonical name → selection, for every name that differs from the stored one.
    mapped: BTreeMap<String, Selection>,
    /// Stored names listed as they are.
    plain: Vec<String>,
}

/// The view of `store` that `cfg` needs, or `None` when the store already holds canonical
/// names.
pub(crate) fn canonical<'a>(cfg: &ModelConfig, store: &'a dyn WeightStore) -> Option<CheckpointView<'a>> {
    let needs = cfg.text_prefix.is_some() || cfg.attn_output_gate || cfg.linear_attention.is_some();
    if !needs {
        return None;
    }
    let names = store.names();
    let mut view = CheckpointView { inner: store, mapped: BTreeMap::new(), plain: Vec::new() };
    let prefix = cfg.text_prefix.as_deref().filter(|p| names.iter().any(|n| n.starts_with(p)));
    for stored in names {
        let name = match prefix {
            Some(p) if stored.starts_with(p) => format!("model.{}", &stored[p.len()..]),
            Some(_) if stored.starts_with("model.") => continue, // the vision tower
            _ => stored.clone(),
        };
        let shape = store.info(&stored).map(|i| i.shape).unwrap_or_default();
        let split = split_rows(cfg, &name, &shape);
        if split.is_empty() && name == stored {
            view.plain.push(stored);
        } else if split.is_empty() {
            view.mapped.insert(name, Selection { source: stored, rows: Vec::new(), shape });
        } else {
            for (canonical, rows, shape) in split {
                view.mapped.insert(canonical, Selection { source: stored.clone(), rows, shape });
            }
        }
    }
    Some(view)
}

pub(crate) type Split = Vec<(String, Vec<Range<usize>>, Vec<usize>)>;

/// The canonical tensors one stored tensor (already under its canonical prefix) splits
/// into; empty when it is canonical as stored.
pub(crate) fn split_rows(cfg: &ModelConfig, name: &str, shape: &[usize]) -> Split {
    let runs = |start: usize, len: usize, groups: usize, stride: usize| -> Vec<Range<usize>> {
        (0..groups).map(|g| g * stride + start..g * stride + start + len).collect()
    };
    if let Some(base) = name.strip_suffix("mlp.experts.gate_up_proj")
        && let [e, two_i, h] = *shape
    {
        let i = two_i / 2;
        return (0..e)
            .flat_map(|x| {
                [("gate_proj", 0), ("up_proj", i)].map(|(part, at)| {
                    (
                        format!("{base}mlp.experts.{x}.{part}.weight"),
                        std::iter::once(x * two_i + at..x * two_i + at + i).collect(),
                        vec![i, h],
                    )
                })
            })
            .collect();
    }
    if let Some(base) = name.strip_suffix("mlp.experts.down_proj")
        && let [e, h, i] = *shape
    {
        return (0..e)
            .map(|x| {
                (
                    format!("{base}mlp.experts.{x}.down_proj.weight"),
                    std::iter::once(x * h..(x + 1) * h).collect(),
                    vec![h, i],
                )
            })
            .collect();
    }
    if let Some(base) = name.strip_suffix("self_attn.q_proj.weight")
        && cfg.attn_output_gate
        && let [rows, h] = *shape
        && rows == 2 * cfg.num_heads * cfg.head_dim
    {
        let (n, d) = (cfg.num_heads, cfg.head_dim);
        return vec![
            (format!("{base}self_attn.q_proj.weight"), runs(0, d, n, 2 * d), vec![n * d, h]),
            (format!("{base}self_attn.q_gate.weight"), runs(d, d, n, 2 * d), vec![n * d, h]),
        ];
    }
    let Some(la) = cfg.linear_attention.as_ref().filter(|la| la.projections == GdnProjections::Grouped) else {
        return Vec::new();
    };
    let (hk, dk, dv) = (la.num_key_heads, la.key_head_dim, la.value_head_dim);
    let r = la.num_value_heads / hk;
    if let Some(base) = name.strip_suffix("linear_attn.in_proj_qkvz.weight")
        && let [_, h] = *shape
    {
        let group = 2 * dk + 2 * r * dv;
        let qkv = [runs(0, dk, hk, group), runs(dk, dk, hk, group), runs(2 * dk, r * dv, hk, group)].concat();
        return vec![
            (format!("{base}linear_attn.in_proj_qkv.weight"), qkv, vec![la.conv_dim(), h]),
            (
                format!("{base}linear_attn.in_proj_z.weight"),
                runs(2 * dk + r * dv, r * dv, hk, group),
                vec![la.value_dim(), h],
            ),
        ];
    }
    if let Some(base) = name.strip_suffix("linear_attn.in_proj_ba.weight")
        && let [_, h] = *shape
    {
        let hv = la.num_value_heads;
        return vec![
            (format!("{base}linear_attn.in_proj_b.weight"), runs(0, r, hk, 2 * r), vec![hv, h]),
            (format!("{base}linear_attn.in_proj_a.weight"), runs(r, r, hk, 2 * r), vec![hv, h]),
        ];
    }
    Vec::new()
}

impl WeightStore for CheckpointView<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.plain.iter().cloned().chain(self.mapped.keys().cloned()).collect();
        names.sort();
        names
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        match self.mapped.get(name) {
            Some(sel) => {
                let stored = self.inner.info(&sel.source)?;
                Some(TensorInfo { name: name.to_owned(), dtype: stored.dtype, shape: sel.shape.clone() })
            }
            None => self.inner.info(name),
        }
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let Some(sel) = self.mapped.get(name) else { return self.inner.host(name) };
        let stored = self.inner.host(&sel.source)?;
        if sel.rows.is_empty() {
            return Ok(stored);
        }
        let dtype = stored.dtype();
        let flat_rows = stored.shape().iter().rev().skip(1).product::<usize>().max(1);
        let row_bytes = stored.bytes().len() / flat_rows;
        let bytes: Cow<'_, [u8]> = match (&sel.rows[..], stored.into_bytes()) {
            ([run], Cow::Borrowed(b)) => Cow::Borrowed(&b[run.start * row_bytes..run.end * row_bytes]),
            (runs, all) => {
                Cow::Owned(runs.iter().flat_map(|r| &all[r.start * row_bytes..r.end * row_bytes]).copied().collect())
            }
        };
        Ok(HostTensor::from_bytes(dtype, &sel.shape, bytes)?)
    }

    fn uniform_run(&self, name: &str) -> Option<met_kernels::UniformRun> {
        if self.mapped.contains_key(name) { None } else { self.inner.uniform_run(name) }
    }
}
