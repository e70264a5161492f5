"""The fixtures ``hf_fixtures.py`` writes: one tiny configuration per architecture, and what
each one covers (``FIXTURES``). Kept apart from the generator so that adding an
architecture is one config function and one entry here.
"""

from __future__ import annotations

from transformers import (
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
)

from hf_fixtures_hybrid import rewrite_config_qwen3_5, rewrite_config_qwen3_next

VOCAB = 512

# --------------------------------------------------------------------------
# Fixture specifications
# --------------------------------------------------------------------------


def llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        # head_dim 16, theta 1e4: wavelengths 2*pi*1e4^(i/8) = 6.3, 19.9, 62.8, ...
        # high_freq_wavelen = 32/4 = 8, low_freq_wavelen = 32/1 = 32, so
        # index 0 is kept (< 8), index 1 is interpolated (8..32) and indices
        # 2..7 are divided by the factor (> 32). check_llama3_bands() asserts it.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )


def mistral_config() -> MistralConfig:
    return MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # hidden/heads would be 16
        max_position_embeddings=256,
        sliding_window=8,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def qwen2_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,  # 3 query heads per kv head
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    )


def qwen3_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # hidden/heads would be 16
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,  # layer 0 full attention, layers 1, 2 sliding
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def qwen3_moe_config() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def llama_tied_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )


def gemma2_config() -> Gemma2Config:
    return Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,  # layers 0 and 2 sliding, 1 full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=24,  # scale 24^-0.5, not head_dim^-0.5
        sliding_window=8,
        # Small caps, so that tanh bends the sharp scores and the logits.
        attn_logit_softcapping=8.0,
        final_logit_softcapping=10.0,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def gemma3_config() -> Gemma3TextConfig:
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,  # sliding_window_pattern 2: layers 0, 2 sliding, 1, 3 full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=32,
        sliding_window=8,
        sliding_window_pattern=2,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0},
        },
    )


# Qwen3-Next and Qwen3.5: full attention every 2nd layer, Gated DeltaNet with twice as many
# value heads as key heads (2 -> 4, 16-wide), a 4-tap conv. Rope base 1e4 rather than the real
# 1e7, so that every one of the 4 rotary frequencies turns over a 160-token prompt.
HYBRID_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    tie_word_embeddings=False,
)
HYBRID_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32)
# Prompts cross transformers' 64-token delta-rule chunks: one exactly a chunk, one a token
# past it, one 2.5 chunks long.
HYBRID_PROMPT_LENS = (1, 6, 23, 64, 65, 160)
# Fields hub Qwen3.5 text configs carry that transformers' classes do not declare.
QWEN3_5_HUB_FIELDS = dict(attn_output_gate=True, mamba_ssm_dtype="float32",
                          mtp_num_hidden_layers=0, mtp_use_dedicated_embeddings=False)
# A vision tower as small as its class allows; text prompts never run it.
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                   num_position_embeddings=16, deepstack_visual_indexes=[])


def alternating_layers(n: int) -> list[str]:
    return ["linear_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def qwen3_next_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        **HYBRID_COMMON,
        **HYBRID_MOE,
        intermediate_size=128,  # unused: every layer is MoE, as in the real config
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        full_attention_interval=2,
        # head_dim 32 x 0.25: a rotary dim of 8.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )


def qwen3_5_config() -> Qwen3_5Config:
    text = dict(
        **HYBRID_COMMON,
        **QWEN3_5_HUB_FIELDS,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        layer_types=alternating_layers(4),
        full_attention_interval=2,
        # rotary dim 32 x 0.25 = 8; mrope sections sum to 8 / 2.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_interleaved": True, "mrope_section": [2, 1, 1]},
    )
    return Qwen3_5Config(text_config=text, vision_config=TINY_VISION, tie_word_embeddings=False)


def qwen3_5_moe_config() -> Qwen3_5MoeConfig:
    text = dict(
        **HYBRID_COMMON,
        **HYBRID_MOE,
        **QWEN3_5_HUB_FIELDS,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        layer_types=alternating_layers(4),
        full_attention_interval=2,
        # rotary dim 16 x 0.5 = 8; mrope sections sum to 8 / 2.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_interleaved": True, "mrope_section": [2, 1, 1]},
    )
    return Qwen3_5MoeConfig(text_config=text, vision_config=TINY_VISION, tie_word_embeddings=False)


FIXTURES = [
    {
        "name": "llama",
        "config": llama_config,
        "base_seed": 1000,
        "classic": True,
        "shard": "100KB",
        "covers": ["gqa", "llama3_rope", "untied_embeddings", "sharded_safetensors",
                   "classic_config_layout"],
    },
    {
        "name": "mistral",
        "config": mistral_config,
        "base_seed": 2000,
        "classic": False,
        "covers": ["gqa", "sliding_window", "explicit_head_dim", "untied_embeddings",
                   "rope_parameters_layout"],
    },
    {
        "name": "qwen2",
        "config": qwen2_config,
        "base_seed": 3000,
        "classic": True,
        "residual_gain": 16.0,
        "covers": ["gqa", "qkv_bias", "tied_embeddings", "linear_rope", "classic_config_layout"],
    },
    {
        "name": "qwen3",
        "config": qwen3_config,
        "base_seed": 4000,
        "classic": False,
        "covers": ["gqa", "qk_norm", "explicit_head_dim", "sliding_window", "max_window_layers",
                   "untied_embeddings", "rope_parameters_layout"],
    },
    {
        "name": "qwen3_moe",
        "config": qwen3_moe_config,
        "base_seed": 5000,
        "classic": False,
        "covers": ["gqa", "qk_norm", "explicit_head_dim", "moe", "top2_routing", "norm_topk_prob",
                   "mlp_only_layers", "per_expert_weights", "untied_embeddings",
                   "rope_parameters_layout"],
    },
    {
        "name": "llama_tied",
        "config": llama_tied_config,
        "base_seed": 6000,
        "classic": True,
        "residual_gain": 16.0,
        "covers": ["mha", "tied_embeddings", "attention_bias", "mlp_bias", "no_rope_scaling",
                   "classic_config_layout"],
    },
    {
        "name": "gemma2",
        "config": gemma2_config,
        "base_seed": 7000,
        "classic": True,
        "gemma": True,
        "covers": ["gqa", "unit_offset_norms", "sandwich_norms", "gelu_tanh", "embedding_scale",
                   "attn_softcap", "final_softcap", "query_pre_attn_scalar", "alternating_sliding",
                   "window_shorter_than_prompt", "tied_embeddings", "classic_config_layout"],
    },
    {
        "name": "gemma3",
        "config": gemma3_config,
        "base_seed": 8000,
        "classic": True,
        "gemma": True,
        "covers": ["gqa", "unit_offset_norms", "sandwich_norms", "gelu_tanh", "embedding_scale",
                   "qk_norm", "query_pre_attn_scalar", "sliding_window_pattern",
                   "window_shorter_than_prompt", "per_layer_rope_base", "global_linear_rope",
                   "tied_embeddings", "classic_config_layout"],
    },
    {
        "name": "qwen3_next",
        "config": qwen3_next_config,
        "base_seed": 9000,
        "classic": False,
        "hybrid": True,
        "rewrite_config": rewrite_config_qwen3_next,
        "experts": "per_expert",
        "prompt_lens": HYBRID_PROMPT_LENS,
        "covers": ["gated_deltanet", "fused_qkvz_ba_projections", "gated_attention", "partial_rotary",
                   "unit_offset_norms", "gated_rmsnorm", "full_attention_interval", "moe",
                   "top2_routing", "norm_topk_prob", "shared_expert_gate", "per_expert_weights",
                   "gqa", "qk_norm", "prompts_cross_chunks", "untied_embeddings",
                   "classic_config_layout"],
    },
    {
        "name": "qwen3_5",
        "config": qwen3_5_config,
        "model_class": Qwen3_5ForConditionalGeneration,
        "base_seed": 10000,
        "classic": False,
        "hybrid": True,
        "rewrite_config": rewrite_config_qwen3_5,
        "prompt_lens": HYBRID_PROMPT_LENS,
        "covers": ["gated_deltanet", "split_qkv_z_b_a_projections", "gated_attention",
                   "partial_rotary", "mrope_text_only", "unit_offset_norms", "gated_rmsnorm",
                   "layer_types", "dense_mlp", "gqa", "qk_norm", "vision_language_wrapper",
                   "prompts_cross_chunks", "untied_embeddings", "rope_parameters_layout"],
    },
    {
        "name": "qwen3_5_moe",
        "config": qwen3_5_moe_config,
        "model_class": Qwen3_5MoeForConditionalGeneration,
        "base_seed": 11000,
        "classic": False,
        "hybrid": True,
        "rewrite_config": rewrite_config_qwen3_5,
        "experts": "fused",
        "prompt_lens": HYBRID_PROMPT_LENS,
        "covers": ["gated_deltanet", "split_qkv_z_b_a_projections", "gated_attention",
                   "partial_rotary", "mrope_text_only", "unit_offset_norms", "gated_rmsnorm",
                   "layer_types", "moe", "top2_routing", "always_norm_topk", "shared_expert_gate",
                   "fused_expert_weights", "gqa", "qk_norm", "vision_language_wrapper",
                   "prompts_cross_chunks", "untied_embeddings", "rope_parameters_layout"],
    },
]
