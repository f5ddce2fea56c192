"""Driving SGLang's tuner: the command, per-batch-size runs of the (patched fixture) tuner, pruning, GPU slots."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from workflow_scripts.moe.model_shapes import read_moe_shape
from workflow_scripts.moe.patch_tuner import prepare_tuner
from workflow_scripts.moe.sglang_tuner import TunerRunError, gpu_slot, pruned_space, run_tuner, tuner_command

from .conftest import CHECKOUTS, MODELS

QWEN35 = MODELS / "qwen35_fp8"


@pytest.fixture(scope="module")
def shape():
    return read_moe_shape(QWEN35, tp_size=4)


def test_command_always_passes_tp_size_and_the_kernel_dtype(shape, tmp_path):
    argv = tuner_command("py", Path("/t"), str(QWEN35), shape, 4, 1, 16, 0, tmp_path / "s.json")
    assert argv[:2] == ["py", "/t/tuning_fused_moe_triton.py"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags["--tp-size"] == "4" and flags["--dtype"] == "fp8_w8a8" and flags["--batch-size"] == "16"
    assert "--tune" in argv and argv[-2:] == ["--search-space-file", str(tmp_path / "s.json")]


def test_patched_tuner_names_the_file_with_its_block_shape(shape, tmp_path):
    tuner = tmp_path / "tuner"
    prepare_tuner(CHECKOUTS / "buggy", tuner)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3"}
    argv = tuner_command(sys.executable, tuner, str(QWEN35), shape, 4, 1, 8, 0, None)
    name, config = run_tuner(argv, env, tmp_path / "bs8", 8, timeout_s=120)
    assert name == "E=256,N=256,device_name=Fixture_GPU,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert config["BLOCK_SIZE_M"] == 16


def test_unpatched_tuner_fails_clearly(shape, tmp_path):
    tuner = CHECKOUTS / "buggy" / "benchmark/kernels/fused_moe_triton"
    argv = tuner_command(sys.executable, tuner, str(QWEN35), shape, 4, 1, 8, 0, None)
    with pytest.raises(TunerRunError, match="tuner exited with 1 at batch size 8"):
        run_tuner(argv, dict(os.environ), tmp_path / "bs8", 8, timeout_s=120)


def test_pruning_keeps_block_m_that_fits_the_rows_per_expert(shape):
    space = [{"BLOCK_SIZE_M": m} for m in (16, 32, 64, 128, 256)]
    assert pruned_space(space, 1, shape) == [{"BLOCK_SIZE_M": 16}]  # 8 rows over 256 experts
    assert [c["BLOCK_SIZE_M"] for c in pruned_space(space, 4096, shape)] == [16, 32, 64, 128]  # 128 rows each


def test_gpu_slots_are_exclusive(tmp_path):
    with gpu_slot(tmp_path, gpus=2, preferred=1, timeout_s=5) as first:
        with gpu_slot(tmp_path, gpus=2, preferred=1, timeout_s=5) as second:
            assert (first, second) == (1, 0)
    with gpu_slot(tmp_path, gpus=1, preferred=0, timeout_s=5):
        with pytest.raises(TimeoutError, match="no free GPU slot among 1"):
            with gpu_slot(tmp_path, gpus=1, preferred=0, timeout_s=0.5):
                pass


def test_halving_on_a_tuner_without_search_space_file_is_refused_before_gpu_work(tmp_path):
    from workflow_scripts.moe import tune_shard

    tuner = tmp_path / "tuner"
    prepare_tuner(CHECKOUTS / "buggy", tuner)
    script = tuner / "tuning_fused_moe_triton.py"
    script.write_text(script.read_text().replace('    parser.add_argument("--search-space-file", type=str)\n', ""))
    with pytest.raises(SystemExit, match="halving needs the tuner's --search-space-file"):
        tune_shard.main(["--engine", "sglang", "--model", str(QWEN35), "--shard", "0", "--shards", "1",
                         "--batch-sizes", "1", "--search", "halving", "--tuner-dir", str(tuner),
                         "--lock-dir", str(tmp_path / "locks"), "--out", str(tmp_path / "0.json")])
    assert not (tmp_path / "0.json").exists() and not (tmp_path / "locks").exists()
