//! The causal depthwise convolution of a Gated DeltaNet layer, SiLU applied.
//!
//! Each sequence sees its rows after the `w - 1` inputs its slot holds (`xpad`, oldest
//! first); output row `i` is `silu(Σ_j weight[c][j] · xpad[i + j])` per channel. The slot
//! is read once, transposed to rows of channels like `x`, before anything is written, so
//! the final states and the snapshots (the `w - 1` inputs up to a row) are cut from that
//! copy and `x` whatever order they are written in.

use crate::Tensor;
use crate::backend::RecurrentBatch;
use crate::check::SeqRun;
use crate::error::Result;

use super::{f32_tensor, for_each_row, read_f32, read_runs, silu_in_place, write_f32};

const OP: &str = "causal_conv1d";

/// One sequence's inputs: its previous `w - 1` inputs (rows of `c`) and its rows of `x`.
struct Padded<'a> {
    history: Vec<f32>,
    rows: &'a [f32],
    c: usize,
    w: usize,
}

impl Padded<'_> {
    /// Input `p` of the padded sequence: history first, then the sequence's own rows.
    fn input(&self, p: usize) -> &[f32] {
        let (c, kept) = (self.c, self.w - 1);
        if p < kept { &self.history[p * c..(p + 1) * c] } else { &self.rows[(p - kept) * c..(p - kept + 1) * c] }
    }

    /// Writes the `w - 1` inputs that precede input `end` into a slot laid out `[c, w - 1]`.
    fn store_before(&self, end: usize, slot: &mut [f32]) {
        let kept = self.w - 1;
        for p in 0..kept {
            for (ch, &v) in self.input(end - kept + p).iter().enumerate() {
                slot[ch * kept + p] = v;
            }
        }
    }
}

pub(crate) fn causal_conv1d(x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Tensor> {
    let crate::check::Conv { t, c, w, capacity } = crate::check::causal_conv1d(x, weight, state, batch)?;
    let runs = read_runs(OP, batch, t, capacity)?;
    let (xs, ws) = (read_f32(OP, x)?, read_f32(OP, weight)?);
    let mut pool = write_f32(OP, state)?;
    let kept = w - 1;
    let padded: Vec<Padded<'_>> = runs
        .iter()
        .map(|r| Padded {
            history: match r.slot {
                Some(slot) => transposed(&pool[slot * c * kept..(slot + 1) * c * kept], c, kept),
                None => vec![0.0; c * kept],
            },
            rows: &xs[r.start * c..r.end * c],
            c,
            w,
        })
        .collect();
    let taps = transposed(&ws, c, w);
    let seq_of_row: Vec<(usize, usize)> =
        runs.iter().enumerate().flat_map(|(s, r)| (0..r.end - r.start).map(move |i| (s, i))).collect();
    let mut out = vec![0f32; t * c];
    for_each_row(&mut out, c, |row, o| {
        let (seq, i) = seq_of_row[row];
        for j in 0..w {
            for ((o, &tap), &v) in o.iter_mut().zip(&taps[j * c..(j + 1) * c]).zip(padded[seq].input(i + j)) {
                *o += tap * v;
            }
        }
        silu_in_place(o);
    });
    for (run, seq) in runs.iter().zip(&padded) {
        store_states(run, seq, &mut pool);
    }
    Ok(f32_tensor(out, &[t, c]))
}

/// Leaves each snapshot's inputs in its slot and the sequence's last inputs in its own
/// (when it has one).
fn store_states(run: &SeqRun, seq: &Padded<'_>, pool: &mut [f32]) {
    let per_slot = seq.c * (seq.w - 1);
    let len = run.end - run.start;
    let own = run.slot.map(|slot| (len, slot));
    for &(rows, slot) in run.snapshots.iter().chain(own.as_ref()) {
        seq.store_before(rows + seq.w - 1, &mut pool[slot * per_slot..(slot + 1) * per_slot]);
    }
}

/// `m [rows, cols]` as `[cols, rows]`.
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols.max(1)).enumerate() {
        for (k, &v) in row.iter().enumerate() {
            out[k * rows + r] = v;
        }
    }
    out
}
