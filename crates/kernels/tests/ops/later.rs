//! Conformance checks of draws left on the device (`sample_later`): the same results as
//! `sample`, with several in flight while uploads go around a device backend's staging
//! buffer, and tokens that later ops read where they are (`gather_u32`, an embedding).

use met_config::SamplingParams;
use met_kernels::{GpuBackend, HostTensor, Result, SampleRow};

use crate::harness::{Rng, expect_err, upload_u32};
use crate::sampling::{Req, upload_logits};

/// `sample_later` returns what `sample` returns, with the drawn tokens on the device for
/// later ops (`gather_u32` reads them without a host round trip): greedy rows, seeded draws
/// with truncation, penalties and logprobs. Several draws are left in flight at once while
/// uploads are queued between them, enough to go around a device backend's staging buffer
/// more than once, and each must still come back right.
pub fn sample_later_equals_sample(b: &dyn GpuBackend) -> Result<()> {
    let (rows, vocab) = (9, 3000);
    let mut rng = Rng::new(77);
    let data: Vec<f32> = rng.vec(rows * vocab).into_iter().map(|x| x * 6.0).collect();
    let logits = upload_logits(b, &data, rows)?;
    let greedy = Req::new(SamplingParams::greedy());
    let drawn = Req::new(SamplingParams { temperature: 0.8, top_p: 0.9, top_k: 50, ..SamplingParams::default() });
    let mut penalised = Req::new(SamplingParams { repetition_penalty: 1.3, ..SamplingParams::greedy() });
    penalised.output = vec![5, 17, 17];
    let logprobs = Req::new(SamplingParams { logprobs: Some(3), ..SamplingParams::greedy() });
    let cases: [(&str, Vec<&Req>); 4] = [
        ("greedy", vec![&greedy; rows]),
        ("drawn", vec![&drawn; rows]),
        ("mixed", vec![&greedy, &drawn, &penalised, &greedy, &drawn, &penalised, &greedy, &drawn, &greedy]),
        ("logprobs", vec![&logprobs, &greedy, &logprobs, &greedy, &greedy, &greedy, &greedy, &greedy, &greedy]),
    ];
    for (name, reqs) in &cases {
        let rows_of = |round: u64| -> Vec<SampleRow<'_>> {
            reqs.iter().enumerate().map(|(r, q)| q.row(r, 1000 + r as u64, round)).collect()
        };
        let mut in_flight = std::collections::VecDeque::new();
        for round in 0..40u64 {
            // 32 KiB queued between draws: 40 rounds go around a 1 MiB staging ring.
            let filler: Vec<u32> = (0..8192).map(|i| i ^ round as u32).collect();
            let queued = upload_u32(b, &filler, &[filler.len()])?;
            in_flight.push_back((round, b.sample_later(&logits, &rows_of(round))?, queued, filler));
            if in_flight.len() > 2 {
                let (round, later, queued, filler) = in_flight.pop_front().expect("three in flight");
                let tokens = later.tokens.clone();
                let got = later.wait()?;
                let want = b.sample(&logits, &rows_of(round))?;
                assert_eq!(got, want, "{name}, round {round}");
                let ids: Vec<u32> = want.iter().map(|s| s.token).collect();
                assert_eq!(b.download_u32(&tokens)?, ids, "{name}, round {round}: tokens on the device");
                let order: Vec<u32> = (0..rows as u32).rev().collect();
                let gathered = b.download_u32(&b.gather_u32(&tokens, &order)?)?;
                assert_eq!(gathered, ids.iter().rev().copied().collect::<Vec<_>>(), "{name}, round {round}: gather");
                assert_eq!(b.download_u32(&queued)?, filler, "{name}, round {round}: an upload queued meanwhile");
            }
        }
    }
    let none = b.sample_later(&logits, &[])?;
    assert_eq!(none.tokens.elem_count(), 0);
    assert!(none.wait()?.is_empty());
    let bad = [greedy.row(rows, 0, 0)];
    expect_err(b.sample_later(&logits, &bad), "a logits row past the batch");
    Ok(())
}

/// A device backend's drawn tokens feed an embedding without a wait for the device
/// (`sample_later`, then `gather_u32`, then `embedding`), and the rows are those of the
/// drawn ids; a row that could not be drawn (every logit `-inf`) reports its error on the
/// wait and embeds as zeros.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn drawn_tokens_feed_an_embedding_without_a_wait(b: &dyn GpuBackend) -> Result<()> {
    let (rows, vocab, h) = (5, 300, 16);
    let mut data: Vec<f32> = Rng::new(5).vec(rows * vocab);
    data[3 * vocab..4 * vocab].fill(f32::NEG_INFINITY);
    let logits = upload_logits(b, &data, rows)?;
    let table_values: Vec<f32> = (0..vocab * h).map(|i| (i % 97) as f32 - 48.0).collect();
    let table = b.upload(&HostTensor::from_f32(&table_values, &[vocab, h]), b.float_dtype())?;
    let greedy = Req::new(SamplingParams::greedy());
    let sample_rows: Vec<SampleRow<'_>> = (0..rows).map(|r| greedy.row(r, 0, 0)).collect();
    let later = b.sample_later(&logits, &sample_rows)?;
    let order: Vec<u32> = vec![4, 3, 0, 1, 2];
    let waited = b.device_wait();
    let embedded = b.embedding(&b.gather_u32(&later.tokens, &order)?, &table)?;
    assert_eq!(b.device_wait(), waited, "the embedding of drawn tokens waited for the device");
    expect_err(later.wait(), "a row with every logit -inf");
    let got = b.download_f32(&embedded)?;
    for (i, &r) in order.iter().enumerate() {
        let row = &got[i * h..(i + 1) * h];
        if r == 3 {
            assert!(row.iter().all(|&x| x == 0.0), "the failed draw's row: {row:?}");
            continue;
        }
        let token = (0..vocab)
            .max_by(|&a, &c| data[r as usize * vocab + a].total_cmp(&data[r as usize * vocab + c]).then(c.cmp(&a)));
        let want = &table_values[token.expect("a vocabulary") * h..][..h];
        assert_eq!(row, want, "row {i} (draw {r})");
    }
    Ok(())
}
