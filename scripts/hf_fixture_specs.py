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
    Qwen3Config,
    Qwen3MoeConfig,
)

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
]
