"""The MoE rules' targets, inputs and argument strings, kept out of rules/moe.smk so that it holds only rules."""

from __future__ import annotations

import shlex
from typing import Any


def moe_outputs(moe: str, moe_cfg: dict[str, Any], has_pairs: bool) -> list[str]:
    """What `rule all` needs from the MoE rules."""
    out = [f"{moe}/roofline.svg"]
    if moe_cfg["tune"]:
        out.append(f"{moe}/installed.json")
    if has_pairs:
        out.append(f"{moe}/ab_vs_roofline.svg")
    return out


def shard_gpu_args(engine: str, moe: str, moe_cfg: dict[str, Any], sglang: dict[str, Any]) -> str:
    """Flags only the SGLang tuner shards take: interpreter, patched tuner, TP size and GPU slots."""
    if engine != "sglang":
        return ""
    return (f"--python {shlex.quote(sglang['python'])} --tuner-dir {shlex.quote(moe + '/tuner')}"
            f" --tp-size {sglang['tp_size']} --gpus {moe_cfg['gpus']} --lock-dir {shlex.quote(moe + '/gpu_locks')}")


def roofline_device_args(device: dict[str, Any], merged: list[str]) -> str:
    """moe.device overrides; else, on GPUs, the device the configs were tuned on (from merged.json)."""
    args = []
    if device["name"]:
        args += ["--device-name", shlex.quote(device["name"])]
    elif merged:
        args += ["--device-from", shlex.quote(merged[0])]
    if device["peak_tflops"]:
        args += ["--peak-tflops", str(device["peak_tflops"])]
    if device["mem_bw_gbs"]:
        args += ["--mem-bw-gbs", str(device["mem_bw_gbs"])]
    return " ".join(args)


def expect_device_arg(device: dict[str, Any]) -> str:
    """The install rule refuses a tuned file for another device than moe.device.name, when it is set."""
    return f"--expect-device {shlex.quote(device['name'])}" if device["name"] else ""
