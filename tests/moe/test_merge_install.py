"""SGLang file naming, shard merging and installing, and the device check."""

from __future__ import annotations

import json

import pytest

from workflow_scripts.engine import fused_moe as engine_moe
from workflow_scripts.moe.install import DeviceMismatchError, install
from workflow_scripts.moe.merge import merge_shards
from workflow_scripts.moe.naming import config_file_name, parse_config_file_name, triton_version_dir

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
NAME = "E=256,N=256,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,dtype=fp8_w8a8,block_shape=[128, 128].json"


def test_file_name_is_sglangs():
    assert config_file_name(256, 256, DEVICE, "fp8_w8a8", [128, 128]) == NAME
    assert config_file_name(8, 14336, "NVIDIA H100 80GB HBM3") == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert config_file_name(8, 64, "X", block_shape=[0, 128]) == "E=8,N=64,device_name=X.json"  # SGLang drops a 0 block
    assert parse_config_file_name(NAME) == {"E": 256, "N": 256, "device_name": DEVICE.replace(" ", "_"),
                                            "dtype": "fp8_w8a8", "block_shape": [128, 128], "per_channel": False,
                                            "down": False}
    with pytest.raises(ValueError, match="not an SGLang fused-MoE config file name"):
        parse_config_file_name("tuned.json")


def test_embedded_engine_names_files_the_same_way():
    assert engine_moe.config_file_name(16, 256, "AMD_EPYC") == config_file_name(16, 256, "AMD_EPYC")


def test_triton_dir():
    assert triton_version_dir("3.4.0") == "triton_3_4_0"
    assert triton_version_dir("3.5.1+git1234") == "triton_3_5_1"
    with pytest.raises(ValueError, match="dotted numbers"):
        triton_version_dir("main")


def _shard(i: int, results: dict, **over) -> dict:
    return {"engine": "sglang", "file_name": NAME, "device_name": DEVICE, "version_dir": "triton_3_4_0",
            "search": "halving", "shard": i, "results": results, **over}


def _cfg(m: int) -> dict:
    return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32 * m, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 3}


def test_merge_orders_batch_sizes_and_checks_coverage(tmp_path):
    records = {tmp_path / "0.json": _shard(0, {"1": {"config": _cfg(1)}, "16": {"config": _cfg(16)}}),
               tmp_path / "1.json": _shard(1, {"4": {"config": _cfg(4)}})}
    merged = merge_shards(records, [1, 4, 16])
    assert list(merged["configs"]) == ["1", "4", "16"]
    assert merged["configs"]["4"] == _cfg(4) and merged["per_batch_size"]["4"]["shard"] == 1
    with pytest.raises(ValueError, match=r"missing \['64'\]"):
        merge_shards(records, [1, 4, 16, 64])


def test_merge_refuses_shards_from_different_devices(tmp_path):
    records = {tmp_path / "0.json": _shard(0, {"1": {"config": _cfg(1)}}),
               tmp_path / "1.json": _shard(1, {"4": {"config": _cfg(4)}}, device_name="NVIDIA H100")}
    with pytest.raises(ValueError, match="1.json: device_name is 'NVIDIA H100'"):
        merge_shards(records, [1, 4])


def test_install_lays_out_the_config_dir(tmp_path):
    merged = merge_shards({tmp_path / "0.json": _shard(0, {"1": {"config": _cfg(1)}, "8": {"config": _cfg(8)}})}, [1, 8])
    record = install(merged, tmp_path / "moe", DEVICE, "merged.json")
    target = tmp_path / "moe" / "configs" / "triton_3_4_0" / NAME
    assert record["file"] == str(target.resolve()) and record["config_dir"] == str((tmp_path / "moe").resolve())
    assert (record["E"], record["N"]) == (256, 256)
    assert json.loads(target.read_text()) == {"1": _cfg(1), "8": _cfg(8)}


def test_install_refuses_a_file_for_another_device(tmp_path):
    merged = merge_shards({tmp_path / "0.json": _shard(0, {"1": {"config": _cfg(1)}})}, [1])
    with pytest.raises(DeviceMismatchError, match="tuned on 'NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition'.*'NVIDIA_H200'"):
        install(merged, tmp_path / "moe", "NVIDIA H200", "merged.json")
    assert not (tmp_path / "moe").exists()

