"""SGLang's fused-MoE config file naming and config-dir layout, in one place.

The server only finds a tuned file whose name matches exactly (a lost `,block_shape=[...]` part
means a silent fall-back to the default config), so every rule names files through here.
"""

from __future__ import annotations

import re

# SGLang's get_config_file_name:
# E=..,N=..,device_name=..[,dtype=..][,block_shape=[n, k]][,per_channel_quant=True][_down].json
_NAME_RE = re.compile(
    r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]+?)"
    r"(?:,dtype=(?P<dtype>[A-Za-z0-9_]+))?(?:,block_shape=\[(?P<block>\d+, \d+)\])?"
    r"(?P<pc>,per_channel_quant=True)?(?P<down>_down)?\.json$"
)


def device_label(name: str) -> str:
    """A device name as SGLang writes it into file names (spaces become underscores)."""
    return name.replace(" ", "_")


def config_file_name(
    num_experts: int,
    shard_n: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: list[int] | None = None,
    per_channel: bool = False,
    down: bool = False,
) -> str:
    """The file name SGLang's server looks up for these shapes on this device."""
    dtype_part = f",dtype={dtype}" if dtype else ""
    block_part = f",block_shape={list(block_shape)}" if block_shape and all(block_shape) else ""
    channel_part = ",per_channel_quant=True" if per_channel else ""
    down_part = "_down" if down else ""
    return (
        f"E={num_experts},N={shard_n},device_name={device_label(device_name)}"
        f"{dtype_part}{block_part}{channel_part}{down_part}.json"
    )


def parse_config_file_name(name: str) -> dict:
    """Fields of a tuned-config file name; ValueError names the file when it is not SGLang's pattern."""
    match = _NAME_RE.match(name)
    if not match:
        raise ValueError(f"{name!r} is not an SGLang fused-MoE config file name (E=..,N=..,device_name=...json)")
    block = match["block"]
    return {
        "E": int(match["E"]),
        "N": int(match["N"]),
        "device_name": match["device"],
        "dtype": match["dtype"],
        "block_shape": [int(x) for x in block.split(", ")] if block else None,
        "per_channel": bool(match["pc"]),
        "down": bool(match["down"]),
    }


def triton_version_dir(triton_version: str) -> str:
    """SGLang's per-Triton config dir: `triton_3_4_0` for Triton 3.4.0 (local build suffixes dropped)."""
    core = triton_version.split("+")[0]
    if not re.fullmatch(r"\d+(\.\d+)*", core):
        raise ValueError(f"triton version {triton_version!r} is not dotted numbers")
    return "triton_" + core.replace(".", "_")
