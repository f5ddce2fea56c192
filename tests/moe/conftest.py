"""Shared paths and tiny real models for the MoE tests."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CHECKOUTS = FIXTURES / "checkouts"
MODELS = FIXTURES / "models"


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory) -> Path:
    """A real (random-weight) Qwen3-MoE checkpoint saved by transformers: E=4, N=8, H=16, top-2, fp32."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=16, num_experts=4, moe_intermediate_size=8, num_experts_per_tok=2,
                         num_hidden_layers=1, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=32, head_dim=8, dtype="float32")
    out = tmp_path_factory.mktemp("tiny_moe")
    Qwen3MoeForCausalLM(cfg).save_pretrained(out)
    return out
