"""The tiny Qwen2 architecture of the built-in models (``dapo.tasks`` warm-starts them) and of the
tests' random models."""

from __future__ import annotations

from transformers import Qwen2Config


def tiny_config(
    vocab_size: int,
    pad_id: int,
    eos_id: int,
    hidden_size: int = 96,
    num_hidden_layers: int = 4,
    intermediate_size: int = 256,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 128,
) -> Qwen2Config:
    """A Qwen2 config with tied embeddings and no BOS token; the defaults are the built-in tiny model."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        rope_theta=10000.0,
    )
