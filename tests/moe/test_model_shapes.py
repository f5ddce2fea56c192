"""The model-config reader: text_config nesting, TP sharding, quantization naming, and refusals."""

from __future__ import annotations

import json

import pytest

from workflow_scripts.moe.model_shapes import MoeConfigError, read_moe_shape

from .conftest import MODELS


def test_nested_text_config_keeps_top_level_fields():
    shape = read_moe_shape(MODELS / "qwen35_fp8", tp_size=4)
    assert shape.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert (shape.num_experts, shape.shard_n, shape.hidden_size, shape.top_k) == (256, 256, 3072, 8)
    assert shape.kernel_dtype == "fp8_w8a8" and shape.block_shape == [128, 128]
    assert shape.weight_bytes == 1.0 and shape.act_dtype == "bfloat16"


def test_flat_config_with_num_local_experts():
    shape = read_moe_shape(MODELS / "qwen3_moe" / "config.json")
    assert (shape.num_experts, shape.shard_n, shape.top_k, shape.act_dtype) == (16, 256, 2, "float32")
    assert shape.kernel_dtype is None and shape.weight_bytes == 4.0


def test_expert_parallel_splits_experts_not_n():
    shape = read_moe_shape(MODELS / "qwen35_fp8", tp_size=4, ep_size=4)
    assert (shape.num_experts, shape.shard_n) == (64, 1024)


def test_config_without_moe_fields_is_refused():
    with pytest.raises(MoeConfigError, match=r"dense/config.json: no MoE field for the expert count"):
        read_moe_shape(MODELS / "dense")


def test_missing_and_broken_configs_are_refused(tmp_path):
    with pytest.raises(MoeConfigError, match="no model config.json"):
        read_moe_shape(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MoeConfigError, match="not valid JSON"):
        read_moe_shape(tmp_path)


def test_unsplittable_tp_and_unknown_quantization_are_refused(tmp_path):
    with pytest.raises(MoeConfigError, match="do not split over tp 3"):
        read_moe_shape(MODELS / "qwen35_fp8", tp_size=3)
    cfg = json.loads((MODELS / "qwen35_fp8" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mystery"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MoeConfigError, match="quant_method 'mystery'"):
        read_moe_shape(tmp_path)
