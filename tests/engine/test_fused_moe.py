"""Fused-MoE strategies agree, and config files are found, chosen and logged as SGLang does."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from workflow_scripts.engine import fused_moe as fm


@pytest.fixture
def moe_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    fm.get_moe_configs.cache_clear()
    yield tmp_path / "configs" / fm.ENGINE_VERSION_DIR
    fm.get_moe_configs.cache_clear()


def reference_moe(hidden, logits, gate_w, up_w, down_w, top_k, renormalize):
    """Token-by-token definition on HF-layout expert weights: softmax, top-k, renormalisation, weighted sum."""
    probs = torch.softmax(logits, -1)
    out = torch.zeros_like(hidden)
    for m in range(hidden.shape[0]):
        w, ids = probs[m].topk(top_k)
        if renormalize:
            w = w / w.sum()
        for weight, e in zip(w, ids):
            gate, up = gate_w[e] @ hidden[m], up_w[e] @ hidden[m]
            out[m] += weight * (down_w[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("M", [1, 3, 37])
@pytest.mark.parametrize("renormalize", [True, False])
def test_every_config_matches_reference(M, renormalize):
    g = torch.Generator().manual_seed(M)
    E, H, N, top_k = 8, 16, 12, 3
    hidden = torch.randn(M, H, generator=g)
    logits = torch.randn(M, E, generator=g)
    gate_w, up_w = (list(torch.randn(E, N, H, generator=g) * 0.3) for _ in range(2))
    down_w = list(torch.randn(E, H, N, generator=g) * 0.3)
    ref = reference_moe(hidden, logits, gate_w, up_w, down_w, top_k, renormalize)
    experts = fm.pack_experts(gate_w, up_w, down_w)
    assert ref.abs().max() > 0.1  # non-trivial output, so agreement means something
    for config in fm.search_space():
        got = fm.fused_moe(hidden, logits, experts, top_k, renormalize, config)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"{config}: {m}")


def test_search_space_covers_strategies_and_blocks():
    space = fm.search_space()
    assert {c["strategy"] for c in space} == {"loop", "sorted", "gather_bmm"}
    assert len({c["block_m"] for c in space}) >= 4
    assert all(fm.validate_config(c, "x") == c for c in space)


def test_naming_follows_sglang():
    assert fm.config_file_name(16, 256, "AMD_EPYC") == "E=16,N=256,device_name=AMD_EPYC.json"
    assert fm.config_file_name(16, 256, "X", "fp8_w8a8") == "E=16,N=256,device_name=X,dtype=fp8_w8a8.json"
    name = fm.device_name()
    assert name and " " not in name


def test_nearest_batch_size_from_file_and_log(moe_dir, caplog):
    moe_dir.mkdir(parents=True)
    path = moe_dir / fm.config_file_name(8, 24, fm.device_name())
    path.write_text(json.dumps({
        "1": {"strategy": "loop", "block_m": 8},
        "16": {"strategy": "sorted", "block_m": 32},
        "64": {"strategy": "gather_bmm", "block_m": 64},
    }))
    with caplog.at_level(logging.INFO, logger=fm.__name__):
        assert fm.get_moe_config(8, 24, 1)["strategy"] == "loop"
        assert fm.get_moe_config(8, 24, 9) == {"strategy": "sorted", "block_m": 32}  # |16-9| < |1-9|
        assert fm.get_moe_config(8, 24, 1000)["strategy"] == "gather_bmm"
    loads = [r for r in caplog.records if "Using MoE kernel config from" in r.getMessage()]
    assert len(loads) == 1  # cached per (E, N)
    assert loads[0].getMessage() == f"Using MoE kernel config from {path.absolute()}."
    assert loads[0].levelno == logging.INFO


def test_missing_file_warns_and_uses_default(moe_dir, caplog):
    with caplog.at_level(logging.INFO, logger=fm.__name__):
        assert fm.get_moe_config(8, 24, 4) == fm.DEFAULT_CONFIG
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "Using default MoE kernel config" in warning.getMessage()
    assert str(moe_dir / fm.config_file_name(8, 24, fm.device_name())) in warning.getMessage()


@pytest.mark.parametrize(
    "content, fault",
    [("{oops", "not valid JSON"), ('{"x": {"strategy": "loop", "block_m": 8}}', "'x'"),
     ('{"4": {"strategy": "magic", "block_m": 8}}', "strategy"), ('{"4": {"strategy": "loop", "block_m": 0}}', "block_m")],
)
def test_bad_config_file_names_file_and_key(moe_dir, content, fault):
    moe_dir.mkdir(parents=True)
    path = moe_dir / fm.config_file_name(8, 24, fm.device_name())
    path.write_text(content)
    with pytest.raises(ValueError, match=fault) as info:
        fm.get_moe_config(8, 24, 4)
    assert str(path) in str(info.value)
