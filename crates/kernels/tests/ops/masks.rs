//! Conformance checks of the logits `sample` reads: rows masked by `mask_logits` (exactly
//! as the CPU backend masks them, and never drawn from where masked), its errors, and bf16
//! logits, which must sample as their f32 values.

use met_config::SamplingParams;
use met_kernels::{DType, GpuBackend, HostTensor, Result, SampleRow, Tensor};

use crate::harness::{Rng, expect_err, upload_f32, upload_u32};
use crate::sampling::{Req, random_logits, upload_logits};

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
