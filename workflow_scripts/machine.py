"""What the machine can do, measured: its streaming memory bandwidth, which the CPU engine's speed follows.

Machines of one kind differed 7x here (5.6 against 38 GB/s), so every figure is quoted with this one beside it.
"""

from __future__ import annotations

import time

import torch

PROBE_MB = 256
CELL_PROBE_MB, CELL_PROBE_PASSES = 32, 3  # ~10-30 ms around each cell: under 1% of a cell's time

_cell_probe: torch.Tensor | None = None


def _pass_gbs(x: torch.Tensor) -> float:
    """One single-thread sum over x, in GB/s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        x.sum()
        return x.numel() * x.element_size() / (time.perf_counter() - t0) / 1e9
    finally:
        torch.set_num_threads(threads)


def stream_bandwidth_gbs(repeats: int = 5) -> float:
    """Best-of-`repeats` single-thread sum over a 256 MB float32 tensor, in GB/s (what a decode step streams)."""
    x = torch.ones(PROBE_MB * 2**20 // 4, dtype=torch.float32)
    return max(_pass_gbs(x) for _ in range(repeats))


def memory_speed_gbs() -> float:
    """The machine's memory speed right now: the median of a few passes over 32 MB (larger than the caches).

    Taken around every measured cell. Other tenants of a shared host move it by up to 2.6x within seconds (1-s
    means of a 64 MB pass in a busy phase; +-4% in a quiet one), and the CPU engine's speed follows it, so its
    spread over a study says how busy the host was while it measured (a sign of the host's noise, not all of it:
    docs/method.md)."""
    global _cell_probe
    if _cell_probe is None:
        _cell_probe = torch.ones(CELL_PROBE_MB * 2**20 // 4, dtype=torch.float32)
    return sorted(_pass_gbs(_cell_probe) for _ in range(CELL_PROBE_PASSES))[CELL_PROBE_PASSES // 2]
