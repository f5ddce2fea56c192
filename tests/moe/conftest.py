"""Shared paths and tiny real models for the MoE tests."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

from workflow_scripts.moe.patch_tuner import TUNER_SUBDIR

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = FIXTURES / "models"


def _assemble_checkouts() -> Path:
    """Three SGLang source trees that differ only in common_utils.py (v0.5.9's buggy shape, the upstream fix, and a
    shape the patcher must refuse), around one stand-in tuner with SGLang's CLI."""
    root = Path(tempfile.mkdtemp(prefix="sglang-checkouts-"))
    atexit.register(shutil.rmtree, root, True)
    for kind in ("buggy", "fixed", "unknown"):
        tuner = root / kind / TUNER_SUBDIR
        tuner.mkdir(parents=True)
        shutil.copy(FIXTURES / "tuner" / "tuning_fused_moe_triton.py", tuner)
        shutil.copy(FIXTURES / "tuner" / f"common_utils_{kind}.py", tuner / "common_utils.py")
    return root


CHECKOUTS = _assemble_checkouts()


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
