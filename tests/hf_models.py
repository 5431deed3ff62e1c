"""Tiny Hugging Face transformers models for the parity tests of ``burst.engine.hf``: Llama's,
and Mistral's and Ministral's (Llama's architecture with a sliding window). Each is made sharp
(queries and keys scaled up, norms off one) so that attention, RoPE and every norm count in its
logits. Skips the calling test without transformers (a dev extra)."""

from __future__ import annotations

import pytest
import torch


def _sharpen(model, norms: bool):
    with torch.no_grad():  # HF inits norms to one and matrices small
        for name, p in model.named_parameters():
            if norms and name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(20.0)
    return model


def hf_llama(tie: bool, kv_heads: int = 2, eps: float = 1e-6, theta: float = 10000.0):
    """A LlamaForCausalLM of 2 layers."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
        rope_theta=theta, rms_norm_eps=eps, tie_word_embeddings=tie,
        attn_implementation="eager")
    torch.manual_seed(0)
    return _sharpen(transformers.LlamaForCausalLM(cfg).eval(), norms=True)


def hf_windowed(kind: str, **window):
    """A MistralForCausalLM or MinistralForCausalLM of 3 layers; ``window``: its
    sliding_window, and Ministral's layer_types."""
    transformers = pytest.importorskip("transformers")
    config, model = {"mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                     "ministral": (transformers.MinistralConfig,
                                   transformers.MinistralForCausalLM)}[kind]
    cfg = config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager",
                 **window)
    torch.manual_seed(0)
    return _sharpen(model(cfg).eval(), norms=False)
