"""check_loaded on SGLang's log lines, and against the embedded engine's real lookup of an installed file."""

from __future__ import annotations

import json
import logging

import pytest

from workflow_scripts.engine import fused_moe as engine_moe
from workflow_scripts.moe.verify import MoeConfigNotLoaded, check_loaded

NAME = "E=256,N=256,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,dtype=fp8_w8a8,block_shape=[128, 128].json"


def test_loaded_line_naming_our_file_passes(tmp_path):
    ours = tmp_path / "configs" / "triton_3_4_0" / NAME
    # SGLang's own log lines, timestamp included
    log = (f"[2026-03-01 10:00:00 TP0] Using MoE kernel config from {ours}.\n"  # diary: ok
           f"[2026-03-01 10:00:00 TP1] Using MoE kernel config from {ours}.\n")  # diary: ok
    check_loaded(log, ours)


def test_default_fallback_names_the_file_sglang_wanted(tmp_path):
    ours = tmp_path / "configs" / "triton_3_4_0" / NAME
    wanted = str(ours).replace(",block_shape=[128, 128]", "")
    log = (f"Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {wanted}, "
           "you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    with pytest.raises(MoeConfigNotLoaded, match=r"looked for .*dtype=fp8_w8a8.json.*installed: .*block_shape=\[128, 128\]"):
        check_loaded(log, ours)


def test_other_triton_fallback_fails(tmp_path):
    ours = tmp_path / "configs" / "triton_3_4_0" / NAME
    other = tmp_path / "configs" / "triton_3_3_1" / NAME
    log = (f"Config file not found at {ours}. Fallback to triton version 3.3.1 and use MoE kernel config from "
           f"{other}. Performance might be sub-optimal!\n")
    with pytest.raises(MoeConfigNotLoaded, match="fell back"):
        check_loaded(log, ours)


def test_another_file_loaded_fails(tmp_path):
    ours = tmp_path / "a" / NAME
    with pytest.raises(MoeConfigNotLoaded, match="instead of the tuned"):
        check_loaded(f"Using MoE kernel config from {tmp_path / 'b' / NAME}.\n", ours)


def test_silent_log_fails(tmp_path):
    with pytest.raises(MoeConfigNotLoaded, match="no 'Using MoE kernel config from' line"):
        check_loaded("server started\n", tmp_path / NAME)


def test_embedded_engine_log_passes_for_the_installed_file(tmp_path, monkeypatch, caplog):
    name = engine_moe.config_file_name(4, 8, engine_moe.device_name())
    target = tmp_path / "configs" / engine_moe.ENGINE_VERSION_DIR / name
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"1": {"strategy": "loop", "block_m": 8}}))
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    engine_moe.get_moe_configs.cache_clear()
    with caplog.at_level(logging.INFO, logger=engine_moe.logger.name):
        assert engine_moe.get_moe_config(4, 8, 3) == {"strategy": "loop", "block_m": 8}
    engine_moe.get_moe_configs.cache_clear()
    check_loaded(caplog.text, target)
    with pytest.raises(MoeConfigNotLoaded):
        check_loaded(caplog.text, tmp_path / "elsewhere.json")

