//! Property tests: matmul against the naive product over random small shapes, and paged
//! attention over random varlen batches, both against the reference and invariant to where
//! the blocks physically sit in the pool.
//!
//! Each property runs through an explicit proptest `TestRunner` inside a function taking
//! `&dyn GpuBackend`, so the `backend_tests!` macro instantiates it per backend like any
//! other check. A failure reports the shrunk input, seeds included, which reproduces it.

use met_kernels::{GpuBackend, Result};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::attention::{Contents, Layout, Seq, attention_reference, pool_blocks, run_paged, shuffled_tables};
use crate::dense::matmul_outputs_and_terms;
use crate::harness::{Rng, compare, compare_terms, tolerance};

/// A runner of `cases` cases that writes no regression files (there is no source file to
/// put them beside, and the failure message carries the input).
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

/// Runs a property, turning a failure into a panic that shows the minimal input.
fn check<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> std::result::Result<(), TestCaseError>,
) -> Result<()>
where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner(cases).run(&strategy, test) {
        panic!("{e}");
    }
    Ok(())
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// `x · wᵀ (+ bias)` matches the f64 reference for every m ≤ 9, k ≤ 40, n ≤ 17, within the
/// tolerance of the terms' magnitude (a 1 × 1 output whose terms cancel has no rms to
/// stand for them: `(1, 29, 1)` with seed 16257260190842158502 sums to -3.5e-3 from terms
/// whose magnitudes add up to 8.7, and the CPU's f32 result is 2.7e-7 off, 3.8 times
/// `1e-5 · 2|want|`; an error of one average term is 3,400 times the new bound).
pub fn matmul_property(b: &dyn GpuBackend) -> Result<()> {
    let shapes = (1usize..=9, 1usize..=40, 1usize..=17, any::<bool>(), any::<u64>());
    check(256, shapes, |(m, k, n, with_bias, seed)| {
        let (got, want, terms) = matmul_outputs_and_terms(b, (m, k, n), with_bias, seed).map_err(fail)?;
        compare_terms(&got, &want, &terms, tolerance(b.float_dtype())).map_err(fail)
    })
}

/// A random batch: up to 4 sequences, contexts up to 13, query lengths from 1 to the
/// context, with a head grouping, an optional window and a block size.
fn batch() -> impl Strategy<Value = (Vec<Seq>, (usize, usize), Option<usize>, usize, u64)> {
    let seqs = prop::collection::vec((1usize..=13, any::<u64>()), 1..=4)
        .prop_map(|v| v.into_iter().map(|(context, r)| Seq { context, q_len: 1 + r as usize % context }).collect());
    let heads = prop::sample::select(vec![(4, 2), (4, 4), (6, 2), (2, 1)]);
    (seqs, heads, prop::option::of(1usize..=6), prop::sample::select(vec![1, 2, 4, 5]), any::<u64>())
}

/// Over random varlen batches, paged attention matches the reference, and the same logical
/// contents under two different block tables give bit-identical outputs.
pub fn paged_attention_property(b: &dyn GpuBackend) -> Result<()> {
    check(128, batch(), |(seqs, (h, h_kv), window, block_size, seed)| {
        let mut layout = Layout::new(h, h_kv, 8, block_size);
        layout.params.sliding_window = window;
        let mut rng = Rng::new(seed);
        let contents = Contents::random(b, &mut rng, &layout, &seqs, 2.0);
        let pool = pool_blocks(&seqs, block_size);
        let (tables_a, tables_b) =
            (shuffled_tables(&mut rng, &seqs, block_size, pool), shuffled_tables(&mut rng, &seqs, block_size, pool));
        let run = |tables| run_paged(b, &layout, &seqs, &contents, tables).and_then(|t| b.download_f32(&t));
        let (out_a, out_b) = (run(&tables_a).map_err(fail)?, run(&tables_b).map_err(fail)?);
        prop_assert!(out_a == out_b, "placement changed the output: {tables_a:?} vs {tables_b:?}");
        compare(&out_a, &attention_reference(&layout.params, &seqs, &contents), tolerance(b.float_dtype()))
            .map_err(fail)
    })
}
