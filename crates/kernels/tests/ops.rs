//! Op conformance tests of every `GpuBackend`.
//!
//! Each check in `ops/` is written once against `&dyn GpuBackend` and compares the
//! backend's result with a naive f64 reference computed on the host from the same inputs,
//! within the tolerance of the backend's float dtype (`harness::tolerance`). The
//! `backend_tests!` macro instantiates every check as a `#[test]` for one backend, in a
//! module named after it (`cpu::matmul_matches_reference`), so adding a backend is one
//! line at the bottom of this file. The CUDA instantiation is compiled with the `cuda`
//! feature and needs a GPU (it runs on the GPU machine, from `cargo xtask gpu-bundle`).
//!
//! Shape and index errors are checked to come back as `Err`, never as a panic: the trait
//! promises that every op validates its operands.

/// The checks, one file per op family, under `tests/ops/`.
mod ops {
    pub mod attention;
    pub mod dense;
    pub mod draws;
    pub mod fp8;
    pub mod harness;
    pub mod later;
    pub mod lora;
    pub mod masks;
    pub mod moe;
    pub mod props;
    pub mod quant;
    pub mod recurrent;
    pub mod recurrent_delta;
    pub mod recurrent_reference;
    pub mod sampling;
}

use ops::{
    attention, dense, draws, fp8, harness, later, lora, masks, moe, props, quant, recurrent, recurrent_delta,
    recurrent_reference, sampling,
};

/// Instantiates every check as a `#[test]` in module `$backend`, each on a fresh backend
/// built by `$make`. A check that exposes a known bug of a backend can carry
/// `#[ignore = "bug: ..."]` in this list, so the suite stays green until it is fixed.
macro_rules! backend_tests {
    ($backend:ident, $make:expr) => {
        mod $backend {
            backend_tests!(@checks $make;
                dense::memory_round_trip,
                dense::empty_tensors_round_trip,
                dense::matmul_matches_reference,
                dense::rms_norm_matches_reference,
                dense::add_rms_norm_matches_reference,
                dense::rotary_matches_reference,
                dense::rotary_at_long_positions,
                dense::random_uniform_is_the_weight_stream,
                dense::silu_mul_matches_reference,
                dense::matmul_decode_batches_match_reference,
                dense::matmul_silu_mul_matches_unfused,
                dense::embedding_matches_reference,
                dense::gather_rows_matches_reference,
                dense::gather_u32_picks_elements,
                dense::add_matches_reference,
                dense::split_columns_matches_reference,
                dense::dense_ops_reject_bad_shapes,
                dense::rms_norm_with_f32_weight_matches_reference,
                dense::gelu_tanh_mul_matches_reference,
                dense::scale_matches_reference,
                dense::softcap_matches_reference,
                moe::topk_routing_matches_reference,
                moe::topk_routing_rejects_bad_k,
                moe::moe_experts_matches_reference,
                moe::moe_experts_grouped_tiles_match_reference,
                moe::moe_experts_rejects_bad_operands,
                moe::moe_experts_zero_intermediate_does_not_panic,
                moe::moe_experts_lora_matches_reference,
                attention::write_kv_places_rows_at_slots,
                attention::paged_attention_gqa_mixed_batch,
                attention::paged_attention_mha_mixed_batch,
                attention::paged_attention_sliding_window,
                attention::paged_attention_softcap,
                attention::paged_attention_smollm_shape,
                attention::paged_attention_long_contexts,
                attention::paged_attention_window_at_32k,
                attention::paged_attention_decode_steps,
                attention::attention_tiled_prefill_shapes,
                attention::write_kv_at_long_contexts,
                attention::qkv_rotary_write_matches_separate_ops,
                attention::attention_rejects_bad_operands,
                attention::fp8_pools_attend_as_their_dequantized_values,
                quant::quantized_weights_compute_with_their_decoded_values,
                quant::gguf_parts_of_mixed_formats_compute_with_their_decoded_values,
                quant::gguf_expert_pairs_compute_with_their_decoded_values,
                fp8::fp8_matrices_compute_with_their_decoded_values,
                fp8::fp8_experts_compute_with_their_decoded_values,
                props::matmul_property,
                props::paged_attention_property,
                sampling::greedy_sample_is_argmax,
                sampling::greedy_sample_applies_bias_penalties_and_bans,
                sampling::repetition_penalty_divides_positive_and_multiplies_negative,
                sampling::frequency_counts_repeats_and_presence_does_not,
                sampling::logprobs_come_from_the_raw_logits,
                sampling::top_k_one_is_greedy,
                draws::truncated_tokens_are_never_drawn,
                draws::draws_invert_the_cdf_at_the_shared_uniform,
                draws::draws_are_reproducible_and_independent_of_the_batch,
                draws::drawn_frequencies_match_the_distribution,
                draws::draft_verification_keeps_the_target_distribution,
                sampling::sample_rejects_bad_arguments,
                masks::mask_logits_matches_reference,
                masks::mask_logits_rejects_bad_operands,
                later::sample_later_equals_sample,
                recurrent::conv_matches_reference,
                recurrent::conv_carries_state_across_steps,
                recurrent::rms_norm_gated_matches_reference,
                recurrent::sigmoid_mul_matches_reference,
                recurrent::state_slots_are_zeroed_and_copied,
                recurrent::conv_rejects_bad_operands,
                recurrent_delta::delta_rule_matches_reference,
                recurrent_delta::delta_rule_matches_reference_at_extreme_gates,
                recurrent_delta::delta_rule_carries_state_across_steps,
                recurrent_delta::delta_rule_long_prompt,
                recurrent_delta::delta_rule_decode_steps,
                recurrent_delta::delta_rule_rejects_bad_operands,
                lora::lora_decode_batches_match_reference,
                lora::lora_prefill_batches_match_reference,
                lora::lora_odd_shapes_match_reference,
                lora::lora_rows_do_not_see_their_batch,
                lora::lora_slot_writes_land_in_their_slot,
                lora::lora_rejects_bad_operands,
            );
        }
    };
    (@checks $make:expr; $($(#[$attr:meta])* $module:ident :: $check:ident),+ $(,)?) => {
        $(
            #[test]
            $(#[$attr])*
            fn $check() -> met_kernels::Result<()> {
                let backend = $make;
                crate::$module::$check(&backend)
            }
        )+
    };
}

backend_tests!(cpu, met_kernels::CpuBackend::new());
#[cfg(feature = "cuda")]
backend_tests!(cuda, met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU"));

/// The attention checks again on the `mma.sync` prefill tiles, the kernels of GPUs before
/// Hopper, which a Hopper GPU otherwise never runs.
#[cfg(feature = "cuda")]
mod cuda_mma {
    backend_tests!(@checks met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU").with_mma_sync_prefill();
        attention::paged_attention_gqa_mixed_batch,
        attention::paged_attention_mha_mixed_batch,
        attention::paged_attention_sliding_window,
        attention::paged_attention_softcap,
        attention::paged_attention_smollm_shape,
        attention::paged_attention_long_contexts,
        attention::attention_tiled_prefill_shapes,
        attention::fp8_pools_attend_as_their_dequantized_values,
        props::paged_attention_property,
    );
}

/// The CPU's integer dots (`--quant-dots int8`, its default), against their own reference.
mod cpu_int8 {
    backend_tests!(@checks met_kernels::CpuBackend::with_dots(met_kernels::QuantDots::Int8);
        quant::k_quant_int8_dots_match_rounded_activations,
    );
}

/// CUDA's Q4_K and Q6_K GEMV over int8 activations, against its own reference.
#[cfg(feature = "cuda")]
mod cuda_gguf_int8 {
    backend_tests!(@checks met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU").with_quant_dots(met_kernels::QuantDots::Int8);
        quant::k_quant_int8_dots_match_rounded_activations,
    );
}

/// The same promise under the integer dots `met` runs the CPU with by default
/// (`--quant-dots int8`), for the packed products that take them.
mod cpu_int8_invariant {
    backend_tests!(@checks met_kernels::CpuBackend::with_dots(met_kernels::QuantDots::Int8);
        quant::gguf_expert_rows_are_batch_invariant,
    );
}

/// The batch-invariance promise (`GpuBackend::batch_invariant`), on the CPU, which always
/// keeps it.
mod cpu_invariant {
    backend_tests!(@checks met_kernels::CpuBackend::new();
        quant::gguf_expert_rows_are_batch_invariant,
        fp8::fp8_rows_are_batch_invariant,
        fp8::fp8_large_batches_match_the_decoded_values,
        dense::matmul_rows_are_batch_invariant,
        attention::attention_rows_are_batch_invariant,
    );
}

/// CUDA under `--batch-invariant`: the promise, and the ops' correctness on its kernels.
#[cfg(feature = "cuda")]
mod cuda_invariant {
    backend_tests!(@checks met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU").with_batch_invariance();
        quant::gguf_expert_rows_are_batch_invariant,
        fp8::fp8_rows_are_batch_invariant,
        fp8::fp8_large_batches_match_the_decoded_values,
        dense::matmul_rows_are_batch_invariant,
        attention::attention_rows_are_batch_invariant,
        dense::matmul_matches_reference,
        dense::matmul_decode_batches_match_reference,
        dense::matmul_silu_mul_matches_unfused,
        attention::paged_attention_gqa_mixed_batch,
        attention::paged_attention_mha_mixed_batch,
        attention::paged_attention_sliding_window,
        attention::paged_attention_softcap,
        attention::paged_attention_long_contexts,
        attention::attention_tiled_prefill_shapes,
        attention::fp8_pools_attend_as_their_dequantized_values,
        props::matmul_property,
        props::paged_attention_property,
        lora::lora_decode_batches_match_reference,
        lora::lora_prefill_batches_match_reference,
        lora::lora_rows_do_not_see_their_batch,
        moe::moe_experts_matches_reference,
        moe::moe_experts_grouped_tiles_match_reference,
    );
}

/// Checks of promises only the CUDA backend makes.
#[cfg(feature = "cuda")]
mod cuda_only {
    /// Without `--batch-invariant`, how many rows of the invariance checks differ (printed
    /// for the record: the default kernels make no such promise, and this is what the flag
    /// buys); the same census under the flag must be empty.
    #[test]
    fn batch_invariance_census() -> met_kernels::Result<()> {
        let default = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        let invariant =
            met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU").with_batch_invariance();
        for (name, b) in [("default", &default), ("--batch-invariant", &invariant)] {
            let ((products, n_products), (attention, n_attention)) = (
                crate::dense::matmul_rows_differing_in_batches(b)?,
                crate::attention::attention_rows_differing_in_batches(b)?,
            );
            println!(
                "BATCH-INVARIANCE {name}: {} of {n_products} product rows and {} of {n_attention} attention rows \
                 differ from the row alone",
                products.len(),
                attention.len()
            );
            if name != "default" {
                assert!(products.is_empty() && attention.is_empty(), "{products:?} {attention:?}");
            }
        }
        Ok(())
    }

    /// The fused delta rule walking 1, 3 and 8 sequences a block gives the bits of a block
    /// a sequence.
    #[test]
    fn delta_rule_walking_sequences_keeps_the_bits() -> met_kernels::Result<()> {
        let one = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        for n in [1, 3, 8] {
            let walking = met_kernels::CudaBackend::new()
                .expect("the cuda op tests need a CUDA GPU")
                .with_delta_seqs_per_block(n);
            crate::recurrent_delta::delta_rule_walks_agree_bit_for_bit(&one, &walking)?;
        }
        Ok(())
    }

    #[test]
    fn matmul_rows_do_not_depend_on_the_batch() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::dense::matmul_rows_do_not_depend_on_the_batch(&backend)
    }

    #[test]
    fn fp8_cuda_narrows_large_batches() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::fp8::fp8_cuda_narrows_large_batches(&backend)
    }

    #[test]
    fn fp8_norm_outputs_feed_the_gemm() -> met_kernels::Result<()> {
        for grid in [crate::fp8::Grid::Row, crate::fp8::Grid::Block] {
            let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
            crate::fp8::fp8_norm_outputs_feed_the_gemm(&backend, grid)?;
        }
        Ok(())
    }

    #[test]
    fn fp8_silu_outputs_feed_the_gemm() -> met_kernels::Result<()> {
        for grid in [crate::fp8::Grid::Row, crate::fp8::Grid::Block] {
            let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
            crate::fp8::fp8_silu_outputs_feed_the_gemm(&backend, grid)?;
        }
        Ok(())
    }

    #[test]
    fn write_u32_columns_keeps_the_other_columns() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::dense::write_u32_columns_keeps_the_other_columns(&backend)
    }

    #[test]
    fn drawn_tokens_feed_an_embedding_without_a_wait() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::later::drawn_tokens_feed_an_embedding_without_a_wait(&backend)
    }

    #[test]
    fn recurrent_decode_replays_in_a_graph() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::recurrent::recurrent_decode_replays_in_a_graph(&backend)
    }

    #[test]
    fn bf16_logits_sample_as_their_f32_values() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::masks::bf16_logits_sample_as_their_f32_values(&backend)
    }

    #[test]
    fn lora_replays_in_a_graph_with_new_slots() -> met_kernels::Result<()> {
        let backend = met_kernels::CudaBackend::new().expect("the cuda op tests need a CUDA GPU");
        crate::lora::lora_replays_in_a_graph_with_new_slots(&backend)
    }
}
