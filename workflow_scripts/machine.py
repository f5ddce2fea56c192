"""What the machine can do, measured: its streaming memory bandwidth, which the CPU engine's speed follows.

Machines of one kind differed 7x here (5.6 against 38 GB/s), so every figure is quoted with this one beside it.
"""

from __future__ import annotations

import time

import torch

PROBE_MB = 256


def stream_bandwidth_gbs(repeats: int = 5) -> float:
    """Best-of-`repeats` single-thread sum over a 256 MB float32 tensor, in GB/s (what a decode step streams)."""
    x = torch.ones(PROBE_MB * 2**20 // 4, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return x.numel() * x.element_size() / best / 1e9
