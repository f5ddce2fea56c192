"""A tiny real CPU tuning run through the embedded engine's fused_moe, shard -> merge -> install -> engine lookup."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from workflow_scripts.engine import fused_moe as engine_moe
from workflow_scripts.moe import install, merge, tune_shard
from workflow_scripts.moe.model_shapes import read_moe_shape
from workflow_scripts.moe.tune_cpu import load_layer_weights, tune_batch_size
from workflow_scripts.moe.verify import check_loaded

from .conftest import MODELS


def test_checkpoint_weights_are_loaded_in_the_engine_layout(tiny_moe_model):
    shape = read_moe_shape(tiny_moe_model)
    weights = load_layer_weights(tiny_moe_model, shape, seed=0)
    assert weights.source.endswith("layer 0")
    assert tuple(weights.experts.w13.shape) == (4, 16, 16) and tuple(weights.experts.w2.shape) == (4, 8, 16)
    assert weights.experts.num_experts == 4 and weights.experts.down[0].out_features == 16
    assert weights.gate is not None and tuple(weights.gate.shape) == (4, 16)


def test_random_weights_when_there_is_no_checkpoint():
    shape = read_moe_shape(MODELS / "qwen3_moe")
    weights = load_layer_weights(MODELS / "qwen3_moe", shape, seed=0)
    assert weights.source.startswith("random (no *.safetensors")
    again = load_layer_weights(MODELS / "qwen3_moe", shape, seed=0)
    assert torch.equal(weights.experts.w13, again.experts.w13)  # seeded


def test_small_space_exhaustive_picks_a_measured_config(tiny_moe_model):
    torch.set_num_threads(1)
    shape = read_moe_shape(tiny_moe_model)
    weights = load_layer_weights(tiny_moe_model, shape, seed=0)
    space = [{"strategy": "loop", "block_m": 8}, {"strategy": "sorted", "block_m": 8}]
    result = tune_batch_size(weights, shape, 4, space, "exhaustive", repeats=2, seed=0)
    assert result["config"] in space and result["evaluations"] == 4
    assert result["time_s"] == min(result["scores_s"].values()) > 0


def test_shards_merge_install_and_the_engine_loads_the_file(tiny_moe_model, tmp_path, monkeypatch, caplog):
    moe = tmp_path / "moe"
    shards = []
    for shard in (0, 1):
        out = moe / "shards" / f"{shard}.json"
        subprocess.run([sys.executable, "-m", "workflow_scripts.moe.tune_shard", "--engine", "embedded",
                        "--model", str(tiny_moe_model), "--shard", str(shard), "--shards", "2",
                        "--batch-sizes", "1", "4", "--search", "halving", "--threads", "1", "--out", str(out)],
                       check=True, capture_output=True, text=True)
        shards.append(out)
    first = json.loads(shards[0].read_text())
    assert first["batch_sizes"] == [1] and first["weights"].endswith("layer 0")
    assert first["file_name"] == engine_moe.config_file_name(4, 8, engine_moe.device_name())
    assert first["results"]["1"]["evaluations"] == 36  # halving's budget: 2 samples per config of the 18

    merge.main(["--shards", *map(str, shards), "--batch-sizes", "1", "4", "--out", str(moe / "merged.json")])
    install.main(["--merged", str(moe / "merged.json"), "--moe-dir", str(moe), "--out", str(moe / "installed.json")])
    installed = json.loads((moe / "installed.json").read_text())
    assert installed["version_dir"] == engine_moe.ENGINE_VERSION_DIR

    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", installed["config_dir"])
    engine_moe.get_moe_configs.cache_clear()
    with caplog.at_level(logging.INFO, logger=engine_moe.logger.name):
        chosen = engine_moe.get_moe_config(4, 8, 4)
    engine_moe.get_moe_configs.cache_clear()
    assert chosen == json.loads((moe / "merged.json").read_text())["configs"]["4"]
    check_loaded(caplog.text, installed["file"])


def test_a_crashing_shard_leaves_the_others_alone(tiny_moe_model, tmp_path):
    good = tmp_path / "0.json"
    tune_shard.main(["--engine", "embedded", "--model", str(tiny_moe_model), "--shard", "0", "--shards", "2",
                     "--batch-sizes", "1", "2", "--search", "halving", "--threads", "1", "--out", str(good)])
    before = good.read_bytes()
    with pytest.raises(Exception, match="no MoE field"):
        tune_shard.main(["--engine", "embedded", "--model", str(MODELS / "dense"), "--shard", "1", "--shards", "2",
                         "--batch-sizes", "1", "2", "--search", "halving", "--out", str(tmp_path / "1.json")])
    assert good.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["0.json"]


def test_striped_shards_cover_every_batch_size_once():
    sizes = [64, 1, 2, 4, 8, 16]
    parts = [tune_shard.shard_batch_sizes(sizes, i, 4) for i in range(4)]
    assert sorted(m for part in parts for m in part) == sorted(sizes)
    assert parts[0] == [1, 16]
    with pytest.raises(ValueError, match="shard 4 is outside 0..3"):
        tune_shard.shard_batch_sizes(sizes, 4, 4)
