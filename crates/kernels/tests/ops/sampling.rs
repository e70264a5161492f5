//! Conformance checks of `sample`: penalties and bans against a naive f64 reference of the
//! rules in `GpuBackend::sample`, logprobs from the raw logits, truncation supports,
//! reproducibility per `(seed, step)` whatever the batch, a chi-square test of the drawn
//! frequencies, and the errors.
//!
//! Draws are deterministic (the seeds are fixed), so every statistical assertion either
//! always passes or always fails; each threshold is chosen so that a correct sampler fails
//! it with probability about 1e-6 over the choice of seed.

use met_config::SamplingParams;
use met_kernels::{DType, DraftToken, GpuBackend, HostTensor, Result, SampleRow, Sampled, Tensor, rng};

use crate::harness::{Rng, assert_values, expect_err, upload_f32, upload_u32};

/// Uploads logits `[rows, vocab]` as f32, as `sample` needs them on every backend.
pub(crate) fn upload_logits(b: &dyn GpuBackend, data: &[f32], rows: usize) -> Result<Tensor> {
    b.upload(&HostTensor::from_f32(data, &[rows, data.len() / rows.max(1)]), DType::F32)
}

/// Everything a sample row borrows, owned.
#[derive(Debug, Clone, Default)]
pub(crate) struct Req {
    params: SamplingParams,
    prompt: Vec<u32>,
    pub(crate) output: Vec<u32>,
    banned: Vec<u32>,
    /// A draft token to verify and the distribution it was drawn from.
    draft: Option<(u32, Vec<f32>)>,
}

impl Req {
    pub(crate) fn new(params: SamplingParams) -> Self {
        Self { params, ..Self::default() }
    }

    pub(crate) fn row(&self, logits_row: usize, seed: u64, step: u64) -> SampleRow<'_> {
        SampleRow {
            logits_row,
            params: &self.params,
            prompt: &self.prompt,
            output: &self.output,
            seed,
            step,
            banned: &self.banned,
            draft: self.draft.as_ref().map(|(token, probs)| DraftToken { token: *token, probs }),
        }
    }
}

/// Steps 2–5 of the rules in f64: bias, repetition (once per distinct token of prompt ∪
/// output), frequency and presence (output only), bans.
fn penalised(raw: &[f32], req: &Req) -> Vec<f64> {
    let p = &req.params;
    let mut x: Vec<f64> = raw.iter().map(|&v| f64::from(v)).collect();
    for &(t, bias) in &p.logit_bias {
        x[t as usize] += f64::from(bias);
    }
    let r = f64::from(p.repetition_penalty);
    let mut seen: Vec<u32> = req.prompt.iter().chain(&req.output).copied().collect();
    seen.sort_unstable();
    seen.dedup();
    for t in seen {
        let v = &mut x[t as usize];
        *v = if *v > 0.0 { *v / r } else { *v * r };
    }
    for (t, v) in x.iter_mut().enumerate() {
        let count = req.output.iter().filter(|&&o| o as usize == t).count();
        if count > 0 {
            *v -= f64::from(p.frequency_penalty) * count as f64 + f64::from(p.presence_penalty);
        }
    }
    for &t in &req.banned {
        x[t as usize] = f64::NEG_INFINITY;
    }
    x
}

/// The first maximum.
fn argmax(x: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Token ids best first by `key`, ties to the lower id.
fn ranked(key: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..key.len()).collect();
    order.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    order
}

/// The exact distribution a non-greedy row draws from: tempered softmax of the penalised
/// logits, then min_p, top_k and top_p (each over what the previous left), renormalised.
fn distribution(raw: &[f32], req: &Req) -> Vec<f64> {
    let p = &req.params;
    let x = penalised(raw, req);
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = x.iter().map(|&v| ((v - max) / f64::from(p.temperature)).exp()).collect();
    let mut kept: Vec<usize> = ranked(&w).into_iter().filter(|&i| w[i] > 0.0 && w[i] >= f64::from(p.min_p)).collect();
    if p.top_k > 0 {
        kept.truncate(p.top_k);
    }
    if p.top_p < 1.0 {
        let target = f64::from(p.top_p) * kept.iter().map(|&i| w[i]).sum::<f64>();
        let mut cum = 0.0;
        let n = kept.iter().position(|&i| {
            cum += w[i];
            cum >= target
        });
        kept.truncate(n.map_or(kept.len(), |n| n + 1));
    }
    let mass: f64 = kept.iter().map(|&i| w[i]).sum();
    let mut probs = vec![0.0; raw.len()];
    for i in kept {
        probs[i] = w[i] / mass;
    }
    probs
}

/// log_softmax of the raw row.
fn log_softmax(raw: &[f32]) -> Vec<f64> {
    let max = raw.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
    let lse = max + raw.iter().map(|&v| (f64::from(v) - max).exp()).sum::<f64>().ln();
    raw.iter().map(|&v| f64::from(v) - lse).collect()
}

/// Draws `n` tokens from logits row 0 with `req`, at steps `0..n` of `seed`, in one call.
fn draw_many(b: &dyn GpuBackend, logits: &Tensor, req: &Req, seed: u64, n: u64) -> Result<Vec<u32>> {
    let rows: Vec<SampleRow<'_>> = (0..n).map(|step| req.row(0, seed, step)).collect();
    Ok(b.sample(logits, &rows)?.into_iter().map(|s| s.token).collect())
}

/// Random logits spread over `[-scale, scale)`.
fn random_logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    rng.vec(n).into_iter().map(|v| v * scale).collect()
}

/// Temperature 0 takes the argmax of each row, the lower id on a tie.
pub fn greedy_sample_is_argmax(b: &dyn GpuBackend) -> Result<()> {
    let (rows, vocab) = (6, 1000);
    let mut logits = random_logits(&mut Rng::new(40), rows * vocab, 4.0);
    logits[5 * vocab + 700] = 9.0;
    logits[5 * vocab + 300] = 9.0;
    let logits_t = upload_logits(b, &logits, rows)?;
    let req = Req::new(SamplingParams::greedy());
    let got = b.sample(&logits_t, &(0..rows).map(|r| req.row(r, 1, 0)).collect::<Vec<_>>())?;
    for (r, s) in got.iter().enumerate() {
        let raw = &logits[r * vocab..(r + 1) * vocab];
        assert_eq!(s.token, argmax(&penalised(raw, &req)), "row {r}");
    }
    assert_eq!(got[5].token, 300, "ties go to the lower id");
    Ok(())
}

/// Greedy after bias, repetition, frequency/presence penalties and bans picks what the
/// reference picks, and in every case that differs from the raw argmax.
pub fn greedy_sample_applies_bias_penalties_and_bans(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 300;
    let raw = random_logits(&mut Rng::new(41), vocab, 3.0);
    let logits_t = upload_logits(b, &raw, 1)?;
    let top = ranked(&raw.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
    let top: Vec<u32> = top[..6].iter().map(|&i| i as u32).collect();
    let greedy = SamplingParams::greedy;
    let cases = [
        Req::new(SamplingParams { logit_bias: vec![(top[5], 2.0), (top[0], -0.5)], ..greedy() }),
        Req {
            prompt: top[..3].to_vec(),
            output: vec![top[3]],
            ..Req::new(SamplingParams { repetition_penalty: 1.8, ..greedy() })
        },
        Req {
            output: vec![top[0], top[0], top[1], top[2]],
            ..Req::new(SamplingParams { frequency_penalty: 1.5, presence_penalty: 0.5, ..greedy() })
        },
        Req { banned: top[..4].to_vec(), ..Req::new(greedy()) },
        Req {
            prompt: vec![top[1], top[1]],
            output: vec![top[0], top[2], top[2]],
            banned: vec![top[3]],
            params: SamplingParams {
                logit_bias: vec![(top[4], 0.1)],
                repetition_penalty: 1.3,
                frequency_penalty: 0.7,
                presence_penalty: 0.4,
                ..greedy()
            },
            draft: None,
        },
    ];
    let rows: Vec<SampleRow<'_>> = cases.iter().map(|c| c.row(0, 0, 0)).collect();
    let got = b.sample(&logits_t, &rows)?;
    for (i, (req, s)) in cases.iter().zip(&got).enumerate() {
        let want = argmax(&penalised(&raw, req));
        assert_ne!(want, top[0], "case {i} is meant to move the argmax");
        assert_eq!(s.token, want, "case {i}: {req:?}");
    }
    Ok(())
}

/// Hugging Face's repetition rule: positive logits are divided, others multiplied, once per
/// distinct token of prompt ∪ output however often it repeats; a penalty below 1 rewards.
pub fn repetition_penalty_divides_positive_and_multiplies_negative(b: &dyn GpuBackend) -> Result<()> {
    let logits = [2.0, 1.0, -3.0, -3.0, -0.5, -0.6, -3.0, -3.0, 1.0, 1.5, -3.0, -3.0];
    let logits_t = upload_logits(b, &logits, 3)?;
    let rep = |r: f32, prompt: &[u32], output: &[u32]| Req {
        prompt: prompt.to_vec(),
        output: output.to_vec(),
        ..Req::new(SamplingParams { repetition_penalty: r, ..SamplingParams::greedy() })
    };
    // (logits row, request, expected token, why)
    let cases = [
        (0, rep(1.5, &[0, 0, 0], &[0, 0]), 0, "2.0 / 1.5 once beats 1.0; five times would not"),
        (0, rep(2.5, &[0], &[]), 1, "2.0 / 2.5 = 0.8 loses to 1.0"),
        (0, rep(2.5, &[], &[0]), 1, "the output counts too"),
        (1, rep(1.5, &[0], &[]), 1, "-0.5 · 1.5 = -0.75 loses to -0.6; dividing would not"),
        (1, rep(1.5, &[0, 1, 1], &[]), 0, "both penalised: -0.75 beats -0.9"),
        (2, rep(0.5, &[0], &[]), 0, "a penalty below 1 doubles 1.0 past 1.5"),
    ];
    let rows: Vec<SampleRow<'_>> = cases.iter().map(|(r, req, _, _)| req.row(*r, 0, 0)).collect();
    let got = b.sample(&logits_t, &rows)?;
    for ((r, req, want, why), s) in cases.iter().zip(&got) {
        assert_eq!(argmax(&penalised(&logits[r * 4..(r + 1) * 4], req)), *want, "reference: {why}");
        assert_eq!(s.token, *want, "{why}");
    }
    Ok(())
}

/// OpenAI's rule: frequency scales with the count in the output, presence applies once,
/// and neither looks at the prompt.
pub fn frequency_counts_repeats_and_presence_does_not(b: &dyn GpuBackend) -> Result<()> {
    let logits_t = upload_logits(b, &[1.0, 0.5, -2.0, -2.0], 1)?;
    let pen = |frequency_penalty, presence_penalty, prompt: &[u32], output: &[u32]| Req {
        prompt: prompt.to_vec(),
        output: output.to_vec(),
        ..Req::new(SamplingParams { frequency_penalty, presence_penalty, ..SamplingParams::greedy() })
    };
    let cases = [
        (pen(0.2, 0.0, &[], &[0, 2, 0, 0]), 1, "1.0 - 3 · 0.2 = 0.4 loses to 0.5"),
        (pen(0.2, 0.0, &[], &[0, 2]), 0, "1.0 - 0.2 = 0.8 beats 0.5"),
        (pen(0.0, 0.2, &[], &[0, 0, 0]), 0, "presence once: 0.8 beats 0.5"),
        (pen(0.0, 0.6, &[], &[0]), 1, "presence applies: 0.4 loses to 0.5"),
        (pen(2.0, 2.0, &[0, 0, 0], &[]), 0, "the prompt is not counted"),
    ];
    let rows: Vec<SampleRow<'_>> = cases.iter().map(|(req, _, _)| req.row(0, 0, 0)).collect();
    let got = b.sample(&logits_t, &rows)?;
    for ((req, want, why), s) in cases.iter().zip(&got) {
        assert_eq!(argmax(&penalised(&[1.0, 0.5, -2.0, -2.0], req)), *want, "reference: {why}");
        assert_eq!(s.token, *want, "{why}");
    }
    Ok(())
}

/// `logprob` and `top_logprobs` are the log_softmax of the raw row, whatever bias,
/// penalties and temperature did to the draw; `top_logprobs` is best first, ties to the
/// lower id, `k` long, and empty for `Some(0)` and `None`.
pub fn logprobs_come_from_the_raw_logits(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 500;
    let mut raw = random_logits(&mut Rng::new(42), vocab, 3.0);
    raw[20] = 4.0;
    raw[10] = 4.0;
    let logits_t = upload_logits(b, &raw, 1)?;
    let want = log_softmax(&raw);
    let sampled = SamplingParams {
        temperature: 0.8,
        logit_bias: vec![(7, 3.0)],
        repetition_penalty: 1.2,
        logprobs: Some(5),
        ..SamplingParams::default()
    };
    let cases = [
        Req { prompt: vec![10, 20, 3], ..Req::new(sampled) },
        Req::new(SamplingParams { logit_bias: vec![(7, 50.0)], logprobs: Some(3), ..SamplingParams::greedy() }),
        Req::new(SamplingParams { logprobs: Some(0), ..SamplingParams::greedy() }),
        Req::new(SamplingParams::greedy()),
    ];
    let rows: Vec<SampleRow<'_>> = cases.iter().map(|c| c.row(0, 5, 0)).collect();
    let got = b.sample(&logits_t, &rows)?;
    let top = ranked(&want);
    for (i, (req, s)) in cases.iter().zip(&got).enumerate() {
        let what = format!("case {i} on {}", b.name());
        match req.params.logprobs {
            Some(_) => {
                let lp = s.logprob.expect("logprobs were asked for");
                assert_values(b, &[lp], &[want[s.token as usize]], &format!("{what}: logprob of {}", s.token));
            }
            None => assert_eq!(s.logprob, None, "{what}: no logprob unless asked"),
        }
        let k = req.params.logprobs.unwrap_or(0);
        let ids: Vec<u32> = s.top_logprobs.iter().map(|&(t, _)| t).collect();
        let want_ids: Vec<u32> = top[..k].iter().map(|&t| t as u32).collect();
        assert_eq!(ids, want_ids, "{what}: top_logprobs ids");
        let values: Vec<f32> = s.top_logprobs.iter().map(|&(_, v)| v).collect();
        assert_values(b, &values, &top[..k].iter().map(|&t| want[t]).collect::<Vec<_>>(), &what);
    }
    assert_eq!(&got[0].top_logprobs.iter().map(|&(t, _)| t).collect::<Vec<_>>()[..2], [10, 20], "tie order");
    assert_eq!(got[1].token, 7, "the bias decides the draw");
    assert!(got[1].logprob.is_some_and(|lp| lp < -1.0), "but not the logprob: {:?}", got[1].logprob);
    Ok(())
}

/// `top_k = 1` at a high temperature always draws the penalised argmax.
pub fn top_k_one_is_greedy(b: &dyn GpuBackend) -> Result<()> {
    let raw = random_logits(&mut Rng::new(43), 100, 2.0);
    let logits_t = upload_logits(b, &raw, 1)?;
    let req = Req {
        output: vec![3, 3, 17],
        ..Req::new(SamplingParams { temperature: 5.0, top_k: 1, frequency_penalty: 0.3, ..SamplingParams::default() })
    };
    let want = argmax(&penalised(&raw, &req));
    let drawn = draw_many(b, &logits_t, &req, 11, 500)?;
    assert!(drawn.iter().all(|&t| t == want), "top_k = 1 drew {drawn:?}, want only {want}");
    Ok(())
}

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

/// A row past the logits, non-f32 or rank-1 logits, token ids past the vocab, a bad
/// parameter, and a row with every token banned are errors, not panics or NaN.
pub fn sample_rejects_bad_arguments(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 16;
    let logits_t = upload_logits(b, &random_logits(&mut Rng::new(46), 2 * vocab, 1.0), 2)?;
    let ok = Req::new(SamplingParams::default());
    let sample = |logits: &Tensor, req: &Req, row: usize| -> Result<Vec<Sampled>> {
        b.sample(logits, &[ok.row(0, 0, 0), req.row(row, 0, 0)])
    };
    expect_err(sample(&logits_t, &ok, 2), "logits row 2 of 2");
    expect_err(sample(&upload_u32(b, &[0; 32], &[2, vocab])?, &ok, 0), "u32 logits");
    expect_err(sample(&upload_f32(b, &[0.0; 16], &[16])?, &ok, 0), "rank-1 logits");
    let bad_ids = [
        ("bias", Req::new(SamplingParams { logit_bias: vec![(16, 1.0)], ..Default::default() })),
        (
            "prompt",
            Req { prompt: vec![1, 16], ..Req::new(SamplingParams { repetition_penalty: 1.2, ..Default::default() }) },
        ),
        // Token lists are checked where the settings read them: the output by a penalty.
        (
            "output",
            Req { output: vec![99], ..Req::new(SamplingParams { presence_penalty: 0.5, ..Default::default() }) },
        ),
        ("banned", Req { banned: vec![u32::MAX], ..Req::new(SamplingParams::default()) }),
        ("temperature", Req::new(SamplingParams { temperature: -1.0, ..Default::default() })),
        ("draft token", Req { draft: Some((16, vec![1.0 / 16.0; 16])), ..Req::new(SamplingParams::default()) }),
        ("draft distribution", Req { draft: Some((3, vec![0.2; 5])), ..Req::new(SamplingParams::default()) }),
    ];
    for (what, req) in &bad_ids {
        expect_err(sample(&logits_t, req, 1), &format!("bad {what}"));
    }
    let all: Vec<u32> = (0..vocab as u32).collect();
    for params in [SamplingParams::greedy(), SamplingParams { top_p: 0.5, ..Default::default() }] {
        let banned = Req { banned: all.clone(), ..Req::new(params) };
        expect_err(sample(&logits_t, &banned, 1), "every token banned");
    }
    let neg_inf = upload_logits(b, &[f32::NEG_INFINITY; 4], 1)?;
    expect_err(b.sample(&neg_inf, &[ok.row(0, 0, 0)]), "every logit -inf");
    Ok(())
}

/// `mask_logits` gathers the listed rows (a row may appear twice, with different masks) and
/// sets every token whose bit is clear to `-inf`, exactly, as the CPU backend does; a vocab
/// that is not a multiple of 32 ignores the spare bits; greedy and seeded draws from the
/// result only ever pick allowed tokens.
pub fn mask_logits_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let cpu = met_kernels::CpuBackend::new();
    for vocab in [1000usize, 64, 5] {
        let (n, words) = (3, vocab.div_ceil(32));
        let raw = random_logits(&mut Rng::new(47 + vocab as u64), n * vocab, 3.0);
        let rows = [2u32, 0, 2, 1];
        let mut rng = Rng::new(7);
        let mut masks: Vec<u32> = (0..rows.len() * words).map(|_| (rng.uniform() * u32::MAX as f32) as u32).collect();
        // Every row allows something: row 1 one token only, row 3 everything (spare bits
        // set too), rows 0 and 2 random tokens and token 0.
        masks[0] |= 1;
        masks[2 * words] |= 1;
        masks[words..2 * words].fill(0);
        masks[words + (vocab - 1) / 32] = 1 << ((vocab - 1) % 32);
        masks[3 * words..].fill(u32::MAX);
        let allowed = |i: usize, t: usize| masks[i * words + t / 32] >> (t % 32) & 1 == 1;
        let want: Vec<f64> = (0..rows.len() * vocab)
            .map(|k| {
                let (i, t) = (k / vocab, k % vocab);
                if allowed(i, t) { f64::from(raw[rows[i] as usize * vocab + t]) } else { f64::NEG_INFINITY }
            })
            .collect();
        let run = |be: &dyn GpuBackend| -> Result<Tensor> {
            let logits = upload_logits(be, &raw, n)?;
            be.mask_logits(
                &logits,
                &upload_u32(be, &rows, &[rows.len()])?,
                &upload_u32(be, &masks, &[rows.len(), words])?,
            )
        };
        let got_t = run(b)?;
        assert_eq!(got_t.dims(), &[rows.len(), vocab][..]);
        let got = b.download_f32(&got_t)?;
        let cpu_got = cpu.download_f32(&run(&cpu)?)?;
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            cpu_got.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(f64::from(g) == w, "vocab {vocab}, element {k}: got {g}, want {w}");
        }
        let greedy = Req::new(SamplingParams::greedy());
        let warm = Req::new(SamplingParams { temperature: 1.5, ..Default::default() });
        for (i, _) in rows.iter().enumerate() {
            for (req, seed) in [(&greedy, 0), (&warm, 11), (&warm, 12), (&warm, 13)] {
                let t = b.sample(&got_t, &[req.row(i, seed, 0)])?[0].token as usize;
                assert!(allowed(i, t), "vocab {vocab}, row {i}: drew masked token {t}");
            }
        }
        assert_eq!(b.sample(&got_t, &[greedy.row(1, 0, 0)])?[0].token as usize, vocab - 1);
    }
    Ok(())
}

/// Wrong dtypes, shapes and row ids are errors, as is sampling a row that allows nothing.
pub fn mask_logits_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let vocab = 40;
    let logits = upload_logits(b, &random_logits(&mut Rng::new(48), 2 * vocab, 1.0), 2)?;
    let rows = upload_u32(b, &[0, 1], &[2])?;
    let masks = upload_u32(b, &[u32::MAX; 4], &[2, 2])?;
    expect_err(b.mask_logits(&logits, &upload_u32(b, &[0, 2], &[2])?, &masks), "row past the logits");
    expect_err(b.mask_logits(&logits, &rows, &upload_u32(b, &[0; 6], &[2, 3])?), "too many mask words");
    expect_err(b.mask_logits(&logits, &rows, &upload_u32(b, &[0; 2], &[1, 2])?), "one mask for two rows");
    expect_err(b.mask_logits(&logits, &rows, &upload_f32(b, &[0.0; 4], &[2, 2])?), "f32 masks");
    expect_err(b.mask_logits(&upload_u32(b, &[0; 80], &[2, vocab])?, &rows, &masks), "u32 logits");
    let none = b.mask_logits(&logits, &rows, &upload_u32(b, &[0, 0, u32::MAX, 0], &[2, 2])?)?;
    expect_err(b.sample(&none, &[Req::new(SamplingParams::greedy()).row(0, 0, 0)]), "every token masked");
    Ok(())
}

/// `x` rounded to the nearest bf16 value (ties to even), as f32.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn bf16_value(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// bf16 logits (what the CUDA head writes) sample as their f32 values: the same tokens,
/// logprobs and top logprobs, bit for bit, and the same masked rows, for the argmax split
/// over blocks (a 128,256-token vocabulary, rows 16-byte aligned, the winner in the last
/// element of one row, a tie across a part boundary in another), odd vocabularies whose rows
/// start unaligned, and the block-per-row path (penalties, draws, logprobs). CUDA only: the
/// CPU backend's logits are f32.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn bf16_logits_sample_as_their_f32_values(b: &dyn GpuBackend) -> Result<()> {
    let greedy = Req::new(SamplingParams::greedy());
    let mut penalised = Req::new(SamplingParams { repetition_penalty: 1.3, ..SamplingParams::greedy() });
    penalised.output = vec![1, 2, 3];
    let warm = Req::new(SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.9, ..Default::default() });
    let logprobs = Req::new(SamplingParams { logprobs: Some(5), ..SamplingParams::greedy() });
    for (vocab, seed) in [(128_256usize, 90u64), (1001, 91), (5, 92)] {
        let rows = 4;
        let mut raw: Vec<f32> =
            random_logits(&mut Rng::new(seed), rows * vocab, 3.0).into_iter().map(bf16_value).collect();
        raw[vocab - 1] = 8.0;
        if vocab > 2 {
            // Equal maxima on either side of a boundary: the lower id must win.
            let (lo, hi) = (vocab / 2 - 1, vocab / 2 + 1);
            raw[vocab + lo] = 7.5;
            raw[vocab + hi] = 7.5;
        }
        let f32_t = upload_logits(b, &raw, rows)?;
        let bf16_t = b.upload(&HostTensor::from_f32(&raw, &[rows, vocab]), DType::BF16)?;
        assert_eq!(bf16_t.dtype(), DType::BF16);
        for (name, req) in [("greedy", &greedy), ("penalised", &penalised), ("warm", &warm), ("logprobs", &logprobs)] {
            let batch: Vec<SampleRow<'_>> = (0..rows).map(|r| req.row(r, 5 + r as u64, 3)).collect();
            let want = b.sample(&f32_t, &batch)?;
            let got = b.sample(&bf16_t, &batch)?;
            assert_eq!(got, want, "vocab {vocab}, {name}");
        }
        assert_eq!(b.sample(&bf16_t, &[greedy.row(0, 0, 0)])?[0].token as usize, vocab - 1);
        let words = vocab.div_ceil(32);
        let masks: Vec<u32> = (0..2 * words).map(|i| 0x9249_2492u32.rotate_left(i as u32) | 1).collect();
        let (sel, masks_t) = (upload_u32(b, &[3, 1], &[2])?, upload_u32(b, &masks, &[2, words])?);
        let want = b.download_f32(&b.mask_logits(&f32_t, &sel, &masks_t)?)?;
        let got = b.download_f32(&b.mask_logits(&bf16_t, &sel, &masks_t)?)?;
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "vocab {vocab}: masked rows");
    }
    Ok(())
}
