"""The tuner patcher on fixture files of each shape, and the patched code run for real on a nested config."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_scripts.moe.model_shapes import MoeConfigError
from workflow_scripts.moe.patch_tuner import (
    ALREADY_PATCHED, BUGGY, FIXED_UPSTREAM, MARKER, TUNER_SUBDIR, TunerShapeError, diagnose, main, patch_source,
    prepare_tuner,
)

from .conftest import CHECKOUTS, MODELS

QWEN35 = MODELS / "qwen35_fp8"


def _common_utils(kind: str) -> Path:
    return CHECKOUTS / kind / TUNER_SUBDIR / "common_utils.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_buggy_shape_is_patched_and_the_fix_runs(tmp_path):
    record = prepare_tuner(CHECKOUTS / "buggy", tmp_path / "tuner")
    assert record["status"] == BUGGY
    assert record["fixed_fields"] == ["architectures", "quantization_config"]
    assert record["common_utils_sha256_before"] != record["common_utils_sha256_after"]
    assert "--search-space-file" in record["tuner_flags"]
    # the original fails as SGLang v0.5.9 does; the patched copy keeps the architecture and the block shape
    with pytest.raises(TypeError):
        _load(_common_utils("buggy"), "buggy_cu").get_model_config(str(QWEN35), tp_size=4)
    got = _load(tmp_path / "tuner" / "common_utils.py", "patched_cu").get_model_config(str(QWEN35), tp_size=4)
    assert got["architecture"] == "Qwen3_5MoeForConditionalGeneration"
    assert got["block_shape"] == [128, 128]
    assert (got["num_experts"], got["shard_intermediate_size"]) == (256, 512)


def test_patch_is_idempotent():
    path = _common_utils("buggy")
    once, first = patch_source(path.read_text(), path)
    twice, second = patch_source(once, path)
    assert first.status == BUGGY and second.status == ALREADY_PATCHED
    assert twice == once
    assert once.count(MARKER) == 1


def test_upstream_fixed_shape_is_left_alone(tmp_path):
    record = prepare_tuner(CHECKOUTS / "fixed", tmp_path / "tuner")
    assert record["status"] == FIXED_UPSTREAM
    assert record["fixed_fields"] == []
    assert (tmp_path / "tuner" / "common_utils.py").read_text() == _common_utils("fixed").read_text()


def test_only_the_lost_field_is_restored():
    """A half fix (architecture read first, quantization_config still read after the unwrap) gets the other half."""
    source = _common_utils("fixed").read_text().replace(
        '    block_shape = None\n    if hasattr(config, "quantization_config") and "weight_block_size" in config.quantization_config:\n'
        '        block_shape = config.quantization_config["weight_block_size"]\n\n', "")
    source = source.replace("    hidden_size = config.hidden_size\n",
                            "    hidden_size = config.hidden_size\n    block_shape = getattr(config, \"quantization_config\", None)\n"
                            "    block_shape = config.quantization_config[\"weight_block_size\"] if block_shape else None\n")
    diag = diagnose(source, Path("half.py"))
    assert diag.status == BUGGY and diag.lost == ["quantization_config"]


def test_unknown_shape_fails_naming_the_file(tmp_path):
    with pytest.raises(TunerShapeError, match=r"unknown/benchmark/kernels/fused_moe_triton/common_utils.py.*unwraps"):
        prepare_tuner(CHECKOUTS / "unknown", tmp_path / "tuner")
    assert not (tmp_path / "tuner").exists()


def test_unparseable_file_is_an_unknown_shape():
    with pytest.raises(TunerShapeError, match="not parseable"):
        diagnose("def get_model_config(:\n", Path("broken.py"))


def test_missing_checkout_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"sglang.checkout {tmp_path / 'nope'}: no such directory"):
        prepare_tuner(tmp_path / "nope", tmp_path / "tuner")
    with pytest.raises(FileNotFoundError, match="tuning_fused_moe_triton.py is missing"):
        prepare_tuner(tmp_path, tmp_path / "tuner")


def test_tuner_without_our_flags_is_refused(tmp_path):
    checkout = tmp_path / "co"
    tuner = checkout / TUNER_SUBDIR
    tuner.mkdir(parents=True)
    (tuner / "common_utils.py").write_text(_common_utils("buggy").read_text())
    (tuner / "tuning_fused_moe_triton.py").write_text("import argparse\nargparse.ArgumentParser().add_argument('--model')\n")
    with pytest.raises(TunerShapeError, match=r"lacks flags \['--tp-size'"):
        prepare_tuner(checkout, tmp_path / "tuner")


def test_cli_refuses_a_model_without_moe_fields_before_copying(tmp_path):
    with pytest.raises(MoeConfigError, match="dense/config.json: no MoE field"):
        main(["--checkout", str(CHECKOUTS / "buggy"), "--model", str(MODELS / "dense"),
              "--out", str(tmp_path / "tuner"), "--report", str(tmp_path / "r.json")])
    assert not (tmp_path / "tuner").exists() and not (tmp_path / "r.json").exists()


def test_cli_writes_the_record(tmp_path):
    out = subprocess.run([sys.executable, "-m", "workflow_scripts.moe.patch_tuner", "--checkout", str(CHECKOUTS / "buggy"),
                          "--model", str(QWEN35), "--tp-size", "4", "--out", str(tmp_path / "tuner"),
                          "--report", str(tmp_path / "r.json")], capture_output=True, text=True, check=True)
    assert "buggy" in out.stdout
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["shape"]["shard_n"] == 256 and record["shape"]["block_shape"] == [128, 128]
