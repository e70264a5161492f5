//! Host side of sampling on the GPU: validate every row as the CPU does, describe each row
//! and its penalised tokens in small arrays, run `sample_rows` (one block per row, see
//! `cuda/sample.cu`), and download only the drawn tokens and logprobs. Logits are f32 or
//! bf16 (the model's head writes bf16 unless a soft-cap asks for f32); the kernels read
//! either as f32, so a row's result does not depend on which.
//!
//! The penalty lists are built here from the request's token lists (uploaded per call):
//! each token that a bias, the repetition penalty, the frequency/presence penalties or a
//! ban touches appears once, with its bias values in their original order, so the kernel
//! applies exactly the CPU's per-token arithmetic.

use std::collections::BTreeMap;

use cudarc::driver::LaunchConfig;
use met_config::MAX_TOP_LOGPROBS;

use super::{CudaBackend, elementwise, launch, ptr};
use crate::backend::{LaterSample, SampleRow, Sampled};
use crate::cpu::sample::check_row;
use crate::error::{Error, Result, ensure};
use crate::{DType, Tensor};

const OP: &str = "sample";
/// `ROW_WORDS` of `sample.cu`.
const ROW_WORDS: usize = 20;
/// `MAX_TOP` of `sample.cu`.
const MAX_TOP: usize = 20;
/// `SAMPLE_THREADS` of `sample.cu`.
const THREADS: u32 = 1024;
/// `NO_TOKEN` of `sample.cu`.
const NO_TOKEN: u32 = u32::MAX;
const FLAG_GREEDY: u32 = 1;
const FLAG_SCRATCH: u32 = 2;
/// Fixed-point weights are 2^-40 units: `vocab · 2^40` must fit a u64.
const MAX_VOCAB: usize = 1 << 23;

const _: () = assert!(MAX_TOP_LOGPROBS <= MAX_TOP, "the kernel returns at most MAX_TOP logprobs");

/// The flat arrays `sample_rows` reads.
#[derive(Default)]
struct Plan {
    rows: Vec<u32>,
    pens: Vec<u32>,
    biases: Vec<f32>,
    scratch_rows: u32,
    any_logprobs: bool,
}

/// What the penalties do to one token.
#[derive(Default)]
struct Touch {
    biases: Vec<f32>,
    repeated: bool,
    count: u32,
    banned: bool,
}

impl Plan {
    fn push(&mut self, row: &SampleRow<'_>, vocab: usize) {
        let p = row.params;
        let pen_start = self.pens.len() / 5;
        let touched = touches(row);
        for (&token, touch) in &touched {
            let bias_start = self.biases.len() as u32;
            self.biases.extend(&touch.biases);
            let flags = u32::from(touch.repeated) | (u32::from(touch.banned) << 1);
            self.pens.extend([token, flags, touch.count, bias_start, touch.biases.len() as u32]);
        }
        let greedy = p.is_greedy();
        let scratch = !greedy || !touched.is_empty();
        let scratch_row = if scratch {
            self.scratch_rows += 1;
            self.scratch_rows - 1
        } else {
            0
        };
        let n_top = p.logprobs.map_or(u32::MAX, |k| k.min(vocab) as u32);
        self.any_logprobs |= p.logprobs.is_some();
        let flags = (u32::from(greedy) * FLAG_GREEDY) | (u32::from(scratch) * FLAG_SCRATCH);
        let words: [u32; ROW_WORDS] = [
            row.logits_row as u32,
            flags,
            p.temperature.to_bits(),
            p.top_k.min(u32::MAX as usize) as u32,
            p.top_p.to_bits(),
            p.min_p.to_bits(),
            row.seed as u32,
            (row.seed >> 32) as u32,
            row.step as u32,
            (row.step >> 32) as u32,
            n_top,
            pen_start as u32,
            touched.len() as u32,
            scratch_row,
            p.repetition_penalty.to_bits(),
            p.frequency_penalty.to_bits(),
            p.presence_penalty.to_bits(),
            0,
            0,
            0,
        ];
        self.rows.extend(words);
    }
}

/// Every token the row's bias, penalties and bans touch (as the CPU applies them: the
/// repetition penalty once per distinct token of prompt ∪ output, frequency and presence by
/// the count in the output).
fn touches(row: &SampleRow<'_>) -> BTreeMap<u32, Touch> {
    let p = row.params;
    let mut touched: BTreeMap<u32, Touch> = BTreeMap::new();
    for &(t, bias) in &p.logit_bias {
        touched.entry(t).or_default().biases.push(bias);
    }
    if p.repetition_penalty != 1.0 {
        for &t in row.prompt.iter().chain(row.output) {
            touched.entry(t).or_default().repeated = true;
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        for &t in row.output {
            touched.entry(t).or_default().count += 1;
        }
    }
    for &t in row.banned {
        touched.entry(t).or_default().banned = true;
    }
    touched
}

/// The kernel `name` for logits of `dtype` (`name_f32` or `name_bf16`), or the error of
/// op `op` for another dtype.
fn for_logits(op: &'static str, name: &str, dtype: DType) -> Result<&'static str> {
    Ok(match (name, dtype) {
        ("sample_rows", DType::F32) => "sample_rows_f32",
        ("sample_rows", DType::BF16) => "sample_rows_bf16",
        ("argmax_parts", DType::F32) => "argmax_parts_f32",
        ("argmax_parts", DType::BF16) => "argmax_parts_bf16",
        ("mask_logits", DType::F32) => "mask_logits_f32",
        ("mask_logits", DType::BF16) => "mask_logits_bf16",
        _ => return Err(Error::DType { op, expected: DType::F32, got: dtype }),
    })
}

/// Checks `logits` and every row as the CPU does; returns the vocabulary.
fn check(logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<usize> {
    for_logits(OP, "sample_rows", logits.dtype())?;
    let d = logits.dims();
    ensure(d.len() == 2, OP, || format!("logits {d:?} are not [rows, vocab]"))?;
    let (n, vocab) = (d[0], d[1]);
    if vocab >= MAX_VOCAB {
        return Err(Error::InvalidArgument(format!("{OP}: a vocabulary of {vocab} exceeds {MAX_VOCAB}")));
    }
    for row in rows {
        check_row(row, n, vocab)?;
    }
    Ok(vocab)
}

pub(super) fn sample(b: &CudaBackend, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<Sampled>> {
    let vocab = check(logits, rows)?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if rows.iter().all(plain_greedy) {
        let tokens = crate::GpuBackend::download_u32(b, &argmax(b, logits, vocab, rows)?)?;
        return rows
            .iter()
            .zip(tokens)
            .map(|(row, token)| {
                if token == NO_TOKEN {
                    return Err(all_masked(row));
                }
                Ok(Sampled { token, logprob: None, top_logprobs: vec![] })
            })
            .collect();
    }
    let mut plan = Plan::default();
    for row in rows {
        plan.push(row, vocab);
    }
    let (tokens, logprobs, top_ids, top_vals) = run(b, logits, vocab, &plan, rows.len())?;
    rows.iter()
        .enumerate()
        .map(|(r, row)| {
            let token = tokens[r];
            if token == NO_TOKEN {
                return Err(all_masked(row));
            }
            let Some(k) = row.params.logprobs else {
                return Ok(Sampled { token, logprob: None, top_logprobs: vec![] });
            };
            let k = k.min(vocab);
            let top = (0..k).map(|j| (top_ids[r * MAX_TOP + j], top_vals[r * MAX_TOP + j])).collect();
            Ok(Sampled { token, logprob: Some(logprobs[r]), top_logprobs: top })
        })
        .collect()
}

/// `GpuBackend::sample_later`: the draws' kernels queued, their tokens on their way to the
/// host. Rows that ask for logprobs are drawn and waited for at once (their results are
/// more than the tokens), as is a batch too large for a landing buffer.
pub(super) fn sample_later(b: &CudaBackend, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<LaterSample> {
    let vocab = check(logits, rows)?;
    let n = rows.len();
    let now = || {
        let sampled = sample(b, logits, rows)?;
        let ids: Vec<u32> = sampled.iter().map(|s| s.token).collect();
        let tokens = if ids.is_empty() { b.alloc(&[0], DType::U32)? } else { b.upload_u32(&ids, &[n])? };
        Ok(LaterSample::new(tokens, move || Ok(sampled)))
    };
    if n == 0 || rows.iter().any(|r| r.params.logprobs.is_some()) {
        return now();
    }
    let tokens = if rows.iter().all(plain_greedy) {
        argmax(b, logits, vocab, rows)?
    } else {
        let mut plan = Plan::default();
        for row in rows {
            plan.push(row, vocab);
        }
        draw(b, logits, vocab, &plan, n)?.tokens
    };
    let Some(copy) = b.dev.download_later(&super::storage(OP, &tokens)?.buf, n * size_of::<u32>())? else {
        return now();
    };
    b.mark_drawn(OP, &tokens)?;
    let logits_rows: Vec<usize> = rows.iter().map(|r| r.logits_row).collect();
    Ok(LaterSample::new(tokens, move || {
        let tokens = copy.wait_u32()?;
        (tokens.into_iter().zip(logits_rows))
            .map(|(token, row)| {
                if token == NO_TOKEN {
                    return Err(all_masked_row(row));
                }
                Ok(Sampled { token, logprob: None, top_logprobs: vec![] })
            })
            .collect()
    }))
}

/// `GpuBackend::mask_logits`: one elementwise kernel over the result, row ids checked on
/// the host copy of `rows`.
pub(super) fn mask_logits(b: &CudaBackend, logits: &Tensor, rows: &Tensor, masks: &Tensor) -> Result<Tensor> {
    const MASK: &str = "mask_logits";
    let (n, v) = crate::check::token_masks(logits, rows, masks)?;
    let ids = b.host_u32(MASK, rows)?;
    if let Some(bad) = ids.iter().find(|&&r| r as usize >= n) {
        return Err(Error::InvalidArgument(format!("{MASK}: row {bad} is past the {n} logits rows")));
    }
    let out = b.alloc(&[ids.len(), v], DType::F32)?;
    let total = ids.len() * v;
    if total > 0 {
        let (x, r, m, o) = (ptr(MASK, logits)?, ptr(MASK, rows)?, ptr(MASK, masks)?, ptr(MASK, &out)?);
        let kernel = for_logits(MASK, "mask_logits", logits.dtype())?;
        launch!(b, kernel, elementwise(total), [x, r, m, o, v as u32, v.div_ceil(32) as u32, total as u64])?;
    }
    Ok(out)
}

fn all_masked(row: &SampleRow<'_>) -> Error {
    all_masked_row(row.logits_row)
}

fn all_masked_row(logits_row: usize) -> Error {
    Error::InvalidArgument(format!("{OP}: every token of logits row {logits_row} is banned or masked"))
}

/// A row that only needs the argmax of its raw logits: greedy, nothing biased, penalised or
/// banned, no logprobs.
fn plain_greedy(row: &SampleRow<'_>) -> bool {
    row.params.is_greedy() && row.params.logprobs.is_none() && touches(row).is_empty()
}

/// `ARGMAX_PARTS` of `sample.cu`.
const ARGMAX_PARTS: usize = 32;
/// `ARGMAX_THREADS` of `sample.cu`.
const ARGMAX_THREADS: u32 = 256;

/// `u32 [rows]` on the device: the argmax of each row's logits, over `ARGMAX_PARTS` blocks
/// per row, then merged.
fn argmax(b: &CudaBackend, logits: &Tensor, vocab: usize, rows: &[SampleRow<'_>]) -> Result<Tensor> {
    let n = rows.len();
    let ids: Vec<u32> = rows.iter().map(|r| r.logits_row as u32).collect();
    let rows_t = b.upload_u32(&ids, &[n])?;
    let part_v = b.alloc(&[n, ARGMAX_PARTS], DType::F32)?;
    let part_i = b.alloc(&[n, ARGMAX_PARTS], DType::U32)?;
    let tokens = b.alloc(&[n], DType::U32)?;
    let parts = (ptr(OP, &part_v)?, ptr(OP, &part_i)?);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, ARGMAX_PARTS as u32, 1),
        block_dim: (ARGMAX_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = for_logits(OP, "argmax_parts", logits.dtype())?;
    launch!(b, kernel, cfg, [ptr(OP, logits)?, vocab as u32, ptr(OP, &rows_t)?, parts.0, parts.1])?;
    let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    launch!(b, "argmax_merge", cfg, [parts.0, parts.1, ptr(OP, &tokens)?])?;
    Ok(tokens)
}

type Outputs = (Vec<u32>, Vec<f32>, Vec<u32>, Vec<f32>);

/// What `sample_rows` writes, on the device.
struct Draws {
    tokens: Tensor,
    logprobs: Tensor,
    top_ids: Tensor,
    top_vals: Tensor,
}

/// Launches the plan's draws and downloads the results.
fn run(b: &CudaBackend, logits: &Tensor, vocab: usize, plan: &Plan, n: usize) -> Result<Outputs> {
    let d = draw(b, logits, vocab, plan, n)?;
    let tokens = crate::GpuBackend::download_u32(b, &d.tokens)?;
    if !plan.any_logprobs {
        return Ok((tokens, Vec::new(), Vec::new(), Vec::new()));
    }
    Ok((
        tokens,
        crate::GpuBackend::download_f32(b, &d.logprobs)?,
        crate::GpuBackend::download_u32(b, &d.top_ids)?,
        crate::GpuBackend::download_f32(b, &d.top_vals)?,
    ))
}

/// Uploads the plan and launches one block per row.
fn draw(b: &CudaBackend, logits: &Tensor, vocab: usize, plan: &Plan, n: usize) -> Result<Draws> {
    let upload_u32 = |data: &[u32]| b.upload_u32(if data.is_empty() { &[0] } else { data }, &[data.len().max(1)]);
    let rows_t = upload_u32(&plan.rows)?;
    let pens_t = upload_u32(&plan.pens)?;
    let biases_t = b.alloc(&[plan.biases.len().max(1)], DType::F32)?;
    b.dev.upload(&super::storage(OP, &biases_t)?.buf, &plan.biases)?;
    let scratch = b.alloc(&[plan.scratch_rows.max(1) as usize, vocab], DType::F32)?;
    let tokens = b.alloc(&[n], DType::U32)?;
    let logprobs = b.alloc(&[n], DType::F32)?;
    let top_ids = b.alloc(&[n, MAX_TOP], DType::U32)?;
    let top_vals = b.alloc(&[n, MAX_TOP], DType::F32)?;
    let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let inputs = (ptr(OP, logits)?, vocab as u32, ptr(OP, &rows_t)?, ptr(OP, &pens_t)?, ptr(OP, &biases_t)?);
    let outputs = (ptr(OP, &scratch)?, ptr(OP, &tokens)?, ptr(OP, &logprobs)?, ptr(OP, &top_ids)?, ptr(OP, &top_vals)?);
    launch!(
        b,
        for_logits(OP, "sample_rows", logits.dtype())?,
        cfg,
        [inputs.0, inputs.1, inputs.2, inputs.3, inputs.4, outputs.0, outputs.1, outputs.2, outputs.3, outputs.4]
    )?;
    Ok(Draws { tokens, logprobs, top_ids, top_vals })
}
