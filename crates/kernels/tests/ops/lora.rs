//! Conformance checks of the LoRA ops: adapters resident in slots, each row's delta read
//! through the slot its row-slot tensor names.
//!
//! The batches mix base rows with two adapters of ranks 8 and 16 in a slot stack of rank
//! 16 (the rank-8 adapter zero-padded, as the model layers store it), across the three
//! modules of a fused q/k/v projection; a third slot holds weights no row names, so a
//! kernel that read the wrong slot fails. The reference is f64 from the stored inputs:
//! `out + scale · (x·Aᵀ)·Bᵀ` per adapted row, and base rows must come back bit for bit.
//! Bounds: the CPU computes in f32 (the harness's 1e-5); the CUDA backend accumulates in
//! f32 and rounds once, the sum `base + delta` to bf16 (the harness's 1e-2 of
//! `|want| + rms`, over two half-ulps of bf16).

use met_kernels::{DType, GpuBackend, HostTensor, LoraSlots, LoraStack, NO_LORA_SLOT, Result, Tensor, lora_row_groups};

use crate::harness::{Rng, assert_close, expect_err, stored, upload_f32, upload_u32};

/// Slots in the stacks, and their padded rank.
const SLOTS: usize = 3;
const RANK: usize = 16;

/// Output columns of the q, k and v modules, in that order.
const PARTS: [usize; 3] = [48, 16, 24];

/// Odd module widths (and so odd columns), which the CUDA expansion writes one at a time.
const ODD_PARTS: [usize; 3] = [47, 17, 25];

/// The adapters' ranks by slot for a stack of rank `rank` (slot 1 is resident but used by
/// no row).
fn ranks(rank: usize) -> [usize; SLOTS] {
    [rank / 2, rank, rank]
}
const SCALES: [f32; SLOTS] = [2.0, 7.0, 0.25];

/// One module's stacks as stored, on the host.
struct Module {
    a: Vec<f32>,
    b: Vec<f32>,
    n: usize,
    column: usize,
    rank: usize,
}

/// Stacks `[SLOTS, RANK, k]` and `[SLOTS, n, RANK]`, zero past each slot's rank.
fn module(b: &dyn GpuBackend, rng: &mut Rng, k: usize, n: usize, column: usize) -> Module {
    module_of_rank(b, rng, k, n, column, RANK)
}

/// Stacks `[SLOTS, rank, k]` and `[SLOTS, n, rank]`, zero past each slot's own rank.
fn module_of_rank(b: &dyn GpuBackend, rng: &mut Rng, k: usize, n: usize, column: usize, rank: usize) -> Module {
    let mut a = stored(b, rng.vec(SLOTS * rank * k));
    let mut bb = stored(b, rng.vec(SLOTS * n * rank));
    for (s, r) in ranks(rank).into_iter().enumerate() {
        a[(s * rank + r) * k..(s + 1) * rank * k].fill(0.0);
        for j in 0..n {
            bb[(s * n + j) * rank + r..(s * n + j + 1) * rank].fill(0.0);
        }
    }
    Module { a, b: bb, n, column, rank }
}

/// Each row's slot: base rows and both adapters interleaved, runs of several rows too.
fn row_slots(t: usize) -> Vec<u32> {
    let pattern = [NO_LORA_SLOT, 0, 2, 2, NO_LORA_SLOT, 0, 0, 2, NO_LORA_SLOT, NO_LORA_SLOT, 2];
    (0..t).map(|i| pattern[i % pattern.len()]).collect()
}

/// The f64 reference of `out` after the deltas.
fn reference(x: &[f32], out: &[f32], rows: &[u32], modules: &[Module], k: usize, width: usize) -> Vec<f64> {
    let mut want: Vec<f64> = out.iter().map(|&v| f64::from(v)).collect();
    for (i, &slot) in rows.iter().enumerate().filter(|(_, s)| **s != NO_LORA_SLOT) {
        let s = slot as usize;
        for m in modules {
            let r = m.rank;
            let shrunk: Vec<f64> = (0..r)
                .map(|q| (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(m.a[(s * r + q) * k + l])).sum())
                .collect();
            for j in 0..m.n {
                let d: f64 = (0..r).map(|q| shrunk[q] * f64::from(m.b[(s * m.n + j) * r + q])).sum();
                want[i * width + m.column + j] += f64::from(SCALES[s]) * d;
            }
        }
    }
    want
}

/// The step's device operands.
struct Step {
    x: Tensor,
    out: Tensor,
    rows: Tensor,
    /// The rows grouped by slot (`LoraSlots::groups`).
    groups: Tensor,
    scales: Tensor,
    stacks: Vec<(Tensor, Tensor, usize)>,
}

impl Step {
    fn upload(b: &dyn GpuBackend, x: &[f32], out: &[f32], rows: &[u32], modules: &[Module], k: usize) -> Result<Self> {
        let (t, width) = (rows.len(), out.len() / rows.len().max(1));
        let stacks = modules
            .iter()
            .map(|m| {
                let a = upload_f32(b, &m.a, &[SLOTS, m.rank, k])?;
                Ok((a, upload_f32(b, &m.b, &[SLOTS, m.n, m.rank])?, m.column))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            x: upload_f32(b, x, &[t, k])?,
            out: upload_f32(b, out, &[t, width])?,
            rows: upload_u32(b, rows, &[t])?,
            groups: upload_u32(b, &lora_row_groups(rows, SLOTS), &[SLOTS + 1 + t])?,
            scales: b.upload(&HostTensor::from_f32(&SCALES, &[SLOTS]), DType::F32)?,
            stacks,
        })
    }

    /// The op on a fresh copy of the base output (which the op may add into), with the
    /// rows' groups.
    fn run(&self, b: &dyn GpuBackend) -> Result<Tensor> {
        self.run_grouped(b, true)
    }

    /// The op with or without the rows' groups (the CUDA shrink by tiles of an adapter's
    /// rows, or a block per row), in a model's order: the shrink, then the base output's
    /// copy (issued while a backend may still be shrinking beside it), then the expansion.
    fn run_grouped(&self, b: &dyn GpuBackend, grouped: bool) -> Result<Tensor> {
        let stacks: Vec<LoraStack<'_>> =
            self.stacks.iter().map(|(a, bb, column)| LoraStack { a, b: bb, column: *column }).collect();
        let groups = grouped.then_some(&self.groups);
        let lora = LoraSlots { rows: &self.rows, scales: &self.scales, stacks: &stacks, groups };
        let shrunk = b.lora_shrink(&self.x, &lora)?;
        let out = b.scale(&self.out, 1.0)?;
        b.lora_expand(&shrunk, out, &lora)
    }
}

/// A batch of `t` rows with inputs of `k` (a multiple of 8 or not: the CUDA shrink reads
/// 16-byte words only then), against the reference; base rows bit for bit.
fn check_mixed(b: &dyn GpuBackend, t: usize, k: usize, seed: u64) -> Result<()> {
    check_shaped(b, t, k, seed, &PARTS, RANK)
}

/// `check_mixed` with modules of `parts` columns and stacks of rank `rank`.
fn check_shaped(b: &dyn GpuBackend, t: usize, k: usize, seed: u64, parts: &[usize], rank: usize) -> Result<()> {
    let mut rng = Rng::new(seed);
    let width: usize = parts.iter().sum();
    let mut column = 0;
    let modules: Vec<Module> = parts
        .iter()
        .map(|&n| {
            column += n;
            module_of_rank(b, &mut rng, k, n, column - n, rank)
        })
        .collect();
    let (x, out, rows) = (stored(b, rng.vec(t * k)), stored(b, rng.vec(t * width)), row_slots(t));
    let step = Step::upload(b, &x, &out, &rows, &modules, k)?;
    let want = reference(&x, &out, &rows, &modules, k, width);
    for grouped in [true, false] {
        let got = step.run_grouped(b, grouped)?;
        let what = format!("lora_shrink_expand of {t} rows of {k}, rank {rank}, grouped {grouped}");
        assert_close(b, &got, &[t, width], &want, &what)?;
        let values = b.download_f32(&got)?;
        for (i, _) in rows.iter().enumerate().filter(|(_, s)| **s == NO_LORA_SLOT) {
            assert_eq!(values[i * width..(i + 1) * width], out[i * width..(i + 1) * width], "base row {i} changed");
        }
    }
    Ok(())
}

/// Decode-sized batches: a few rows, inputs of 64 (the 16-byte path) and of 52.
pub fn lora_decode_batches_match_reference(b: &dyn GpuBackend) -> Result<()> {
    for (t, seed) in [(1, 1), (3, 2), (8, 3), (11, 4)] {
        check_mixed(b, t, 64, seed)?;
    }
    check_mixed(b, 5, 52, 5)
}

/// Prefill-sized batches: hundreds of rows, crossing several of the CUDA kernels' row tiles.
pub fn lora_prefill_batches_match_reference(b: &dyn GpuBackend) -> Result<()> {
    check_mixed(b, 300, 128, 6)?;
    check_mixed(b, 97, 36, 7)?;
    // Inputs over eight spans of the grouped shrink, one of them ragged; wider ranks.
    check_shaped(b, 40, 1096, 14, &PARTS, 32)?;
    check_shaped(b, 33, 520, 15, &PARTS[..1], 64)
}

/// A row's delta depends on the row alone: the rows of a batch in reverse order (so other
/// rows share each one's tiles) give each row bit for bit the same output.
pub fn lora_rows_do_not_see_their_batch(b: &dyn GpuBackend) -> Result<()> {
    let (t, k) = (90, 192);
    let mut rng = Rng::new(16);
    let width: usize = PARTS.iter().sum();
    let mut column = 0;
    let modules: Vec<Module> = PARTS
        .iter()
        .map(|&n| {
            column += n;
            module(b, &mut rng, k, n, column - n)
        })
        .collect();
    let (x, out, rows) = (stored(b, rng.vec(t * k)), stored(b, rng.vec(t * width)), row_slots(t));
    let reversed = |v: &[f32], w: usize| -> Vec<f32> { v.chunks(w).rev().flatten().copied().collect() };
    let rev_rows: Vec<u32> = rows.iter().rev().copied().collect();
    let forward = Step::upload(b, &x, &out, &rows, &modules, k)?;
    let backward = Step::upload(b, &reversed(&x, k), &reversed(&out, width), &rev_rows, &modules, k)?;
    let got = b.download_f32(&forward.run(b)?)?;
    let got_rev = b.download_f32(&backward.run(b)?)?;
    assert_eq!(got, reversed(&got_rev, width), "rows in reverse order on {}", b.name());
    Ok(())
}

/// Shapes off the kernels' fast paths: odd module widths (and odd first columns), a rank
/// that is not a multiple of 8, and a rank of 24 that takes ranks eight at a time in three
/// groups.
pub fn lora_odd_shapes_match_reference(b: &dyn GpuBackend) -> Result<()> {
    check_shaped(b, 70, 64, 11, &ODD_PARTS, RANK)?;
    check_shaped(b, 9, 40, 12, &PARTS, 12)?;
    check_shaped(b, 130, 72, 13, &ODD_PARTS, 24)
}

/// Writing a slot changes that slot alone, in bf16/f32 stacks and the f32 scales.
pub fn lora_slot_writes_land_in_their_slot(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(8);
    let init = stored(b, rng.vec(SLOTS * 4 * 6));
    let stack = upload_f32(b, &init, &[SLOTS, 4, 6])?;
    let slot = stored(b, rng.vec(4 * 6));
    b.lora_write_slot(&stack, 1, &upload_f32(b, &slot, &[4, 6])?)?;
    let mut want = init;
    want[24..48].copy_from_slice(&slot);
    assert_eq!(b.download_f32(&stack)?, want, "stack after writing slot 1 on {}", b.name());
    let scales = b.upload(&HostTensor::from_f32(&SCALES, &[SLOTS]), DType::F32)?;
    b.lora_write_slot(&scales, 2, &b.upload(&HostTensor::from_f32(&[0.5], &[1]), DType::F32)?)?;
    assert_eq!(b.download_f32(&scales)?, [SCALES[0], SCALES[1], 0.5], "scales on {}", b.name());
    expect_err(b.lora_write_slot(&stack, SLOTS, &upload_f32(b, &slot, &[4, 6])?), "a slot past the stack");
    expect_err(b.lora_write_slot(&stack, 0, &upload_f32(b, &slot[..20], &[20])?), "a short slot");
    Ok(())
}

/// Operands that do not fit: a row slot past the stacks, overlapping or too many modules,
/// ranks that differ between modules, columns past the output.
pub fn lora_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let (t, k) = (2, 8);
    let mut rng = Rng::new(9);
    let modules = [module(b, &mut rng, k, 4, 0), module(b, &mut rng, k, 4, 4)];
    let (x, out) = (stored(b, rng.vec(t * k)), stored(b, rng.vec(t * 8)));
    let step = Step::upload(b, &x, &out, &[0, 2], &modules, k)?;
    let fresh = || b.scale(&step.out, 1.0);
    let with = |rows: &Tensor, stacks: &[LoraStack<'_>]| {
        b.lora_shrink_expand(&step.x, fresh()?, &LoraSlots { rows, scales: &step.scales, stacks, groups: None })
    };
    let grouped = |groups: &Tensor, stacks: &[LoraStack<'_>]| {
        let lora = LoraSlots { rows: &step.rows, scales: &step.scales, stacks, groups: Some(groups) };
        b.lora_shrink_expand(&step.x, fresh()?, &lora)
    };
    let [(a0, b0, _), (a1, b1, _)] = &step.stacks[..] else { unreachable!("two modules") };
    let ok = [LoraStack { a: a0, b: b0, column: 0 }, LoraStack { a: a1, b: b1, column: 4 }];
    with(&step.rows, &ok)?;
    grouped(&step.groups, &ok)?;
    expect_err(grouped(&upload_u32(b, &[0; SLOTS + 2], &[SLOTS + 2])?, &ok), "row groups of another length");
    let wrong = lora_row_groups(&[2, 0], SLOTS);
    expect_err(grouped(&upload_u32(b, &wrong, &[wrong.len()])?, &ok), "row groups of other row slots");
    expect_err(with(&upload_u32(b, &[0, SLOTS as u32], &[2])?, &ok), "a row slot past the stacks");
    expect_err(with(&upload_u32(b, &[0], &[1])?, &ok), "row slots of another length");
    let overlapping = [LoraStack { a: a0, b: b0, column: 0 }, LoraStack { a: a1, b: b1, column: 2 }];
    expect_err(with(&step.rows, &overlapping), "overlapping module columns");
    expect_err(with(&step.rows, &[LoraStack { a: a0, b: b0, column: 6 }]), "columns past the output");
    let four = [ok[0], ok[1], ok[0], ok[1]];
    expect_err(with(&step.rows, &four), "four modules in one projection");
    let narrow = upload_f32(b, &vec![0.0; SLOTS * 8 * k], &[SLOTS, 8, k])?;
    let mixed = [ok[0], LoraStack { a: &narrow, b: b1, column: 4 }];
    expect_err(with(&step.rows, &mixed), "ranks that differ between modules");
    expect_err(with(&step.rows, &[]), "no module");
    Ok(())
}

/// A decode step of the op recorded in a graph and replayed with other row slots written
/// before each replay (adapters changing between steps, base rows among them) gives bit
/// for bit the eager op's output. Only for backends with graphs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn lora_replays_in_a_graph_with_new_slots(b: &dyn GpuBackend) -> Result<()> {
    if !b.supports_graphs() {
        return Ok(());
    }
    // Four rows (a block per row), and forty (the CUDA shrink's tiles of one adapter's rows).
    let cases: [[u32; 4]; 4] =
        [[0, 2, NO_LORA_SLOT, 0], [2, 2, 2, 2], [NO_LORA_SLOT; 4], [NO_LORA_SLOT, 0, 1, NO_LORA_SLOT]];
    for (t, seed) in [(4, 10), (40, 17)] {
        let k = 64;
        let mut rng = Rng::new(seed);
        let width: usize = PARTS.iter().sum();
        let mut column = 0;
        let modules: Vec<Module> = PARTS
            .iter()
            .map(|&n| {
                column += n;
                module(b, &mut rng, k, n, column - n)
            })
            .collect();
        let (x, out) = (stored(b, rng.vec(t * k)), stored(b, rng.vec(t * width)));
        let step = Step::upload(b, &x, &out, &vec![NO_LORA_SLOT; t], &modules, k)?;
        let result = b.zeros(&[t, width], b.float_dtype())?;
        let graph = b.capture(&mut || b.copy_into(&step.run(b)?, &result))?;
        for case in cases {
            let rows: Vec<u32> = (0..t).map(|i| case[(i * 7 / 3) % 4]).collect();
            b.write_u32(&step.rows, &rows)?;
            b.write_u32(&step.groups, &lora_row_groups(&rows, SLOTS))?;
            graph.replay()?;
            let eager = Step::upload(b, &x, &out, &rows, &modules, k)?;
            let want = b.download_f32(&eager.run(b)?)?;
            assert_eq!(b.download_f32(&result)?, want, "replay of {t} rows with slots {rows:?} on {}", b.name());
        }
    }
    Ok(())
}
