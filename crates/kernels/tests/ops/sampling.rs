//! Conformance checks of `sample`'s rules: penalties and bans against a naive f64
//! reference of the rules in `GpuBackend::sample`, logprobs from the raw logits, and the
//! errors. The reference (`Req`, `distribution`, ...) is shared with the checks of the draws
//! (`draws.rs`) and of masked and bf16 logits (`masks.rs`).
//!
//! Draws are deterministic (the seeds are fixed), so every statistical assertion either
//! always passes or always fails; each threshold is chosen so that a correct sampler fails
//! it with probability about 1e-6 over the choice of seed.

use met_config::SamplingParams;
use met_kernels::{DType, DraftToken, GpuBackend, HostTensor, Result, SampleRow, Sampled, Tensor};

use crate::harness::{Rng, assert_values, expect_err, upload_f32, upload_u32};

/// Uploads logits `[rows, vocab]` as f32, as `sample` needs them on every backend.
pub(crate) fn upload_logits(b: &dyn GpuBackend, data: &[f32], rows: usize) -> Result<Tensor> {
    b.upload(&HostTensor::from_f32(data, &[rows, data.len() / rows.max(1)]), DType::F32)
}

/// Everything a sample row borrows, owned.
#[derive(Debug, Clone, Default)]
pub(crate) struct Req {
    pub(crate) params: SamplingParams,
    pub(crate) prompt: Vec<u32>,
    pub(crate) output: Vec<u32>,
    pub(crate) banned: Vec<u32>,
    /// A draft token to verify and the distribution it was drawn from.
    pub(crate) draft: Option<(u32, Vec<f32>)>,
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
pub(crate) fn ranked(key: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..key.len()).collect();
    order.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    order
}

/// The exact distribution a non-greedy row draws from: tempered softmax of the penalised
/// logits, then min_p, top_k and top_p (each over what the previous left), renormalised.
pub(crate) fn distribution(raw: &[f32], req: &Req) -> Vec<f64> {
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
pub(crate) fn draw_many(b: &dyn GpuBackend, logits: &Tensor, req: &Req, seed: u64, n: u64) -> Result<Vec<u32>> {
    let rows: Vec<SampleRow<'_>> = (0..n).map(|step| req.row(0, seed, step)).collect();
    Ok(b.sample(logits, &rows)?.into_iter().map(|s| s.token).collect())
}

/// Random logits spread over `[-scale, scale)`.
pub(crate) fn random_logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
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
