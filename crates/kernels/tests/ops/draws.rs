//! Conformance checks of the tokens `sample` draws: truncation supports, the inverse CDF at
//! the shared uniform, reproducibility per `(seed, step)` whatever the batch, a chi-square
//! test of the drawn frequencies, and draft verification that keeps the target's
//! distribution. The f64 reference of the rules is `sampling.rs`'s.
//!
//! Draws are deterministic (the seeds are fixed), so every statistical assertion either
//! always passes or always fails; each threshold is chosen so that a correct sampler fails
//! it with probability about 1e-6 over the choice of seed.

use met_config::SamplingParams;
use met_kernels::{GpuBackend, Result, SampleRow, rng};

use crate::harness::Rng;
use crate::sampling::{Req, distribution, draw_many, random_logits, ranked, upload_logits};

/// Over 4000 draws, no token outside the reference support of top_k / top_p / min_p /
/// bans is ever drawn, and every token of the support expected 30+ times is drawn (a miss
/// has probability below e⁻³⁰).
pub fn truncated_tokens_are_never_drawn(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 64;
    let raw = random_logits(&mut Rng::new(44), vocab, 3.0);
    let logits_t = upload_logits(b, &raw, 1)?;
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    let cases = [
        Req::new(p(1.5, 5, 1.0, 0.0)),
        Req::new(p(1.0, 0, 0.6, 0.0)),
        Req::new(p(1.0, 0, 1.0, 0.3)),
        Req::new(p(0.9, 10, 0.8, 0.05)),
        Req { banned: (0..vocab as u32).filter(|t| t % 3 != 0).collect(), ..Req::new(p(2.0, 0, 1.0, 0.0)) },
    ];
    let n = 4000;
    for (i, req) in cases.iter().enumerate() {
        let probs = distribution(&raw, req);
        let support = probs.iter().filter(|&&q| q > 0.0).count();
        assert!(support > 1 && support < vocab, "case {i} is meant to truncate ({support} tokens kept)");
        let mut counts = vec![0u64; vocab];
        for t in draw_many(b, &logits_t, req, 1000 + i as u64, n)? {
            counts[t as usize] += 1;
        }
        for (t, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
            assert!(q > 0.0 || c == 0, "case {i}: token {t} is outside the support but was drawn {c} times");
            assert!(q * (n as f64) < 30.0 || c > 0, "case {i}: token {t} (p = {q:.4}) was never drawn");
        }
    }
    // Equal logits weigh exactly 1 each: top_p 0.5 of 4 is reached (not passed) by exactly
    // two tokens, and ties go to the lower ids, for top_k too.
    let ties_t = upload_logits(b, &[0.0; 4], 1)?;
    for (params, support) in [(p(1.0, 0, 0.5, 0.0), 2), (p(1.0, 3, 1.0, 0.0), 3), (p(1.0, 3, 0.5, 0.0), 2)] {
        let mut drawn = draw_many(b, &ties_t, &Req::new(params.clone()), 5, 400)?;
        drawn.sort_unstable();
        drawn.dedup();
        assert_eq!(drawn, (0..support).collect::<Vec<u32>>(), "{params:?}");
    }
    Ok(())
}

/// Each draw is the inverse CDF of the reference distribution, walked best first (ties to
/// the lower id), at the shared uniform `rng::uniform(seed, step)`. The backend's weights
/// round differently from the f64 reference, so a draw may differ only where `u` lies
/// within 1e-5 of a CDF boundary.
pub fn draws_invert_the_cdf_at_the_shared_uniform(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 256;
    let raw = random_logits(&mut Rng::new(47), vocab, 4.0);
    let logits_t = upload_logits(b, &raw, 1)?;
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    let cases = [
        Req::new(p(0.8, 0, 0.95, 0.0)),
        Req::new(p(1.2, 20, 1.0, 0.02)),
        Req { output: vec![3, 3, 9], ..Req::new(SamplingParams { presence_penalty: 0.5, ..p(0.5, 0, 1.0, 0.0) }) },
    ];
    let (seed, n) = (31, 2000);
    for (i, req) in cases.iter().enumerate() {
        let probs = distribution(&raw, req);
        let order = ranked(&probs);
        let mut cum = 0.0;
        let cdf: Vec<f64> = order
            .iter()
            .map(|&t| {
                cum += probs[t];
                cum
            })
            .collect();
        let mut near_boundary = 0;
        for (step, got) in (0..n).zip(draw_many(b, &logits_t, req, seed, n)?) {
            let u = f64::from(rng::uniform(seed, step));
            let want = order[cdf.iter().position(|&c| c > u).unwrap_or(vocab - 1)] as u32;
            if got != want {
                let gap = cdf.iter().map(|c| (c - u).abs()).fold(f64::INFINITY, f64::min);
                assert!(gap < 1e-5, "case {i} step {step}: drew {got}, the CDF at u = {u} gives {want}");
                near_boundary += 1;
            }
        }
        assert!(near_boundary <= 2, "case {i}: {near_boundary} draws differ at boundaries");
    }
    Ok(())
}

/// A row's draw is a function of its own inputs and `(seed, step)`: alone or among 31
/// others in shuffled order, repeated, it gives the same `Sampled`; other steps and other
/// seeds draw other tokens.
pub fn draws_are_reproducible_and_independent_of_the_batch(b: &dyn GpuBackend) -> Result<()> {
    let (others, vocab) = (31, 2000);
    let mut rng = Rng::new(45);
    let all = random_logits(&mut rng, (others + 1) * vocab, 3.0);
    let reqs: Vec<Req> = (0..=others)
        .map(|i| Req {
            prompt: vec![i as u32, 5, 9],
            output: vec![7, 7, (i * 13) as u32],
            ..Req::new(SamplingParams {
                temperature: 0.5 + i as f32 / 20.0,
                top_p: 0.95,
                top_k: if i % 2 == 0 { 0 } else { 40 },
                repetition_penalty: 1.1,
                presence_penalty: 0.2,
                logprobs: Some(3),
                ..Default::default()
            })
        })
        .collect();
    let target = &all[..vocab];
    let alone_t = upload_logits(b, target, 1)?;
    // Row r of the batch holds source row order[r]; the target (source row 0) sits somewhere
    // in the middle, and the sample rows come in another shuffled order.
    let mut order: Vec<usize> = (0..=others).collect();
    rng.shuffle(&mut order);
    let batch: Vec<f32> = order.iter().flat_map(|&src| all[src * vocab..(src + 1) * vocab].iter().copied()).collect();
    let batch_t = upload_logits(b, &batch, others + 1)?;
    let mut calls: Vec<usize> = (0..=others).collect();
    rng.shuffle(&mut calls);
    for step in [0, 1, 17, 1 << 40] {
        let seed_of = |src: usize| 77 + src as u64;
        let alone = b.sample(&alone_t, &[reqs[0].row(0, seed_of(0), step)])?;
        let position = |src: usize| order.iter().position(|&s| s == src).expect("every source row is placed");
        let rows: Vec<SampleRow<'_>> =
            calls.iter().map(|&src| reqs[src].row(position(src), seed_of(src), step)).collect();
        let mixed = b.sample(&batch_t, &rows)?;
        let in_batch = &mixed[calls.iter().position(|&src| src == 0).expect("the target is called")];
        assert_eq!(in_batch, &alone[0], "step {step}: the batch changed the draw");
        assert_eq!(b.sample(&alone_t, &[reqs[0].row(0, seed_of(0), step)])?, alone, "step {step}: repeat");
    }
    // A flat distribution: 64 steps of one seed, and step 0 of 64 seeds, spread widely.
    let flat = Req::new(SamplingParams { temperature: 2.0, ..Default::default() });
    let steps = draw_many(b, &alone_t, &flat, 3, 64)?;
    let seeds = b.sample(&alone_t, &(0..64).map(|seed| flat.row(0, seed, 0)).collect::<Vec<_>>())?;
    for (what, mut tokens) in [("steps", steps), ("seeds", seeds.iter().map(|s| s.token).collect())] {
        tokens.sort_unstable();
        tokens.dedup();
        assert!(tokens.len() > 20, "64 {what} drew only {} distinct tokens", tokens.len());
    }
    Ok(())
}

/// Pearson's χ² of `counts` against `probs` over the cells `probs` allows, with its degrees
/// of freedom.
fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let cells: Vec<(u64, f64)> = counts.iter().zip(probs).filter(|&(_, &q)| q > 0.0).map(|(&c, &q)| (c, q)).collect();
    let stat = cells.iter().map(|&(c, q)| (c as f64 - n as f64 * q).powi(2) / (n as f64 * q)).sum();
    (stat, cells.len() - 1)
}

/// The χ² value a correct sampler exceeds with probability 1e-6, by degrees of freedom
/// (upper quantiles of the χ² distribution, from the regularised incomplete gamma).
fn chi_square_critical(df: usize) -> f64 {
    [23.928, 27.631, 30.665, 33.377, 35.888, 38.258, 40.522][df - 1]
}

/// 20 000 draws (steps 0..20 000 of a fixed seed) from 8 tokens follow the exact truncated
/// distribution: χ² below its 1e-6 critical value, no masked token drawn. The same counts
/// are rejected against a wrong distribution, so the test can fail.
pub fn drawn_frequencies_match_the_distribution(b: &dyn GpuBackend) -> Result<()> {
    let raw = [2.0, 1.5, 1.1, 0.7, 0.3, -0.2, -0.8, -1.5];
    let logits_t = upload_logits(b, &raw, 1)?;
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    // Temperature 1 without truncation: wrong for the truncated cases. `top_p` measured
    // against all tokens instead of the min_p/top_k survivors keeps a fourth token.
    let untruncated = distribution(&raw, &Req::new(p(1.0, 0, 1.0, 0.0)));
    let top_p_of_all = distribution(&raw, &Req::new(p(0.7, 0, 0.9, 0.0)));
    let cases = [
        (p(0.7, 0, 0.9, 0.0), 4, untruncated.clone()),
        (p(0.7, 4, 0.9, 0.05), 3, top_p_of_all),
        (p(1.0, 0, 1.0, 0.0), 8, distribution(&raw, &Req::new(p(0.7, 0, 1.0, 0.0)))),
    ];
    let n = 20_000;
    for (i, (params, support, wrong)) in cases.into_iter().enumerate() {
        let req = Req::new(params);
        let probs = distribution(&raw, &req);
        assert_eq!(probs.iter().filter(|&&q| q > 0.0).count(), support, "case {i}: reference support");
        let mut counts = [0u64; 8];
        for t in draw_many(b, &logits_t, &req, 2024, n)? {
            counts[t as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &probs);
        let critical = chi_square_critical(df);
        assert!(stat < critical, "case {i}: χ² = {stat:.2} ≥ {critical} (df {df}), counts {counts:?}, want {probs:?}");
        for (t, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
            assert!(q > 0.0 || c == 0, "case {i}: masked token {t} drawn {c} times");
        }
        let (wrong_stat, wrong_df) = chi_square(&counts, &wrong);
        let wrong_critical = chi_square_critical(wrong_df);
        assert!(wrong_stat > wrong_critical, "case {i}: counts {counts:?} pass against the wrong {wrong:?}");
    }
    Ok(())
}

/// The token drawn from `q` by inverse CDF in id order at `u` (a test's own draft).
fn draw_from(q: &[f64], u: f64) -> u32 {
    let mut cum = 0.0;
    let last = q.iter().rposition(|&w| w > 0.0).expect("a distribution");
    q.iter()
        .position(|&w| {
            cum += w;
            w > 0.0 && cum > u
        })
        .unwrap_or(last) as u32
}

/// Speculative sampling keeps the target's distribution: at each of 20 000 steps a draft
/// token is drawn from a draft distribution `q` and verified by a row of the target's
/// settings (temperature, truncation, penalties, bans), and the emitted tokens follow the
/// target's exact distribution `p` (χ² below the 1e-6 critical value, the suite's level;
/// the draws are seeded, so it passes or fails deterministically). Two wrong rules fail the
/// same test, so it can: resampling from `p` instead of `max(0, p − q)` after a rejection,
/// and accepting every draft (emitting `q`).
pub fn draft_verification_keeps_the_target_distribution(b: &dyn GpuBackend) -> Result<()> {
    let raw = [2.0, 1.5, 1.1, 0.7, 0.3, -0.2, -0.8, -1.5];
    let logits_t = upload_logits(b, &raw, 1)?;
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    let targets = [
        Req::new(p(0.8, 0, 0.9, 0.0)),
        Req { output: vec![0, 0, 3], ..Req::new(SamplingParams { frequency_penalty: 0.4, ..p(1.3, 6, 1.0, 0.02) }) },
        Req { banned: vec![1], ..Req::new(p(1.0, 0, 1.0, 0.0)) },
    ];
    // A flat draft, and one that favours what the target does not.
    let reversed: Vec<f32> = raw.iter().rev().copied().collect();
    let drafts = [vec![0.125f64; 8], distribution(&reversed, &Req::new(p(2.0, 0, 1.0, 0.0)))];
    let n = 20_000u64;
    for (i, target) in targets.iter().enumerate() {
        let want = distribution(&raw, target);
        for (j, q) in drafts.iter().enumerate() {
            let what = format!("target {i}, draft {j} on {}", b.name());
            let q32: Vec<f32> = q.iter().map(|&w| w as f32).collect();
            let (mut right, mut resampled, mut accepted_all) = ([0u64; 8], [0u64; 8], [0u64; 8]);
            for step in 0..n {
                let x = draw_from(q, f64::from(rng::uniform(9_000 + j as u64, step)));
                let verifying = Req { draft: Some((x, q32.clone())), ..target.clone() };
                right[b.sample(&logits_t, &[verifying.row(0, 2024, step)])?[0].token as usize] += 1;
                let u = f64::from(rng::uniform(rng::accept_stream(2024), step));
                let wrong = if u * q[x as usize] < want[x as usize] {
                    x
                } else {
                    b.sample(&logits_t, &[target.row(0, 2024, step)])?[0].token
                };
                resampled[wrong as usize] += 1;
                accepted_all[x as usize] += 1;
            }
            let (stat, df) = chi_square(&right, &want);
            let critical = chi_square_critical(df);
            assert!(stat < critical, "{what}: χ² = {stat:.2} ≥ {critical} (df {df}), counts {right:?}, want {want:?}");
            for (t, (&c, &w)) in right.iter().zip(&want).enumerate() {
                assert!(w > 0.0 || c == 0, "{what}: token {t} outside the target's support emitted {c} times");
            }
            for (rule, counts) in [("resampling from p", resampled), ("accepting every draft", accepted_all)] {
                let (stat, _) = chi_square(&counts, &want);
                assert!(stat > critical, "{what}: the wrong rule {rule} passes, χ² = {stat:.2}, counts {counts:?}");
            }
        }
    }
    Ok(())
}
