"""How the embedded engine sets up torch: one function for the engine in-process (benchmarks, tests) and the engine
process behind the HTTP server, so that the two run the same forwards at the same speed.

Threads are the setting that matters. Left to torch, the intra-op pool takes every core; on a 2-core host that also
runs the front, the client and other work, each of the many small ops of a decode forward then ends in an OpenMP
barrier that waits for a thread the kernel has parked (docs/embedded_engine_served.md: the served engine at 0.6 of
in-process, most of its samples in libgomp). So an engine without an explicit count runs one thread, as the study
configures it (`server.num_threads`).

`torch_config()` reads back what the calling thread uses, so the engine process can report its scheduling thread's
setup (`/get_server_info` `engine_torch`) and a test can hold it equal to the in-process engine's. torch is imported
inside the functions that need it: the front resolves the thread count too (for the engine process's OpenMP
environment) and never loads torch.
"""

from __future__ import annotations

import os
import sys

from workflow_scripts.engine.types import EngineConfigError

THREADS_ENV = "SPECSTUDY_ENGINE_THREADS"
DEFAULT_THREADS = 1
INTEROP_THREADS = 1  # the engine never forks torch work (no torch.jit.fork): a second inter-op thread only idles


def engine_threads(num_threads: int | None) -> int:
    """The intra-op thread count: the flag, else $SPECSTUDY_ENGINE_THREADS, else DEFAULT_THREADS."""
    if num_threads:
        return num_threads
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return DEFAULT_THREADS
    try:
        threads = int(value)
    except ValueError:
        raise EngineConfigError(f"{THREADS_ENV}={value!r}: not an integer") from None
    if threads < 1:
        raise EngineConfigError(f"{THREADS_ENV}={value!r}: must be >= 1")
    return threads


def configure_torch(num_threads: int | None) -> int:
    """Apply the engine's torch setup to this process and return the thread count it set.

    The inter-op pool can be sized only before torch first uses it; a process that already did (a second engine in
    one benchmark) keeps its size, which torch_config() then reports."""
    import torch

    threads = engine_threads(num_threads)
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != INTEROP_THREADS:
        try:
            torch.set_num_interop_threads(INTEROP_THREADS)
        except RuntimeError:  # "cannot set number of interop threads after parallel work has started"
            pass
    return threads


def torch_config() -> dict:
    """The calling thread's torch setup, as plain JSON values (call it on the thread that runs the forwards)."""
    import torch

    return {
        "num_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "sched_policy": _sched_policy(),
    }


def _sched_policy() -> str | None:
    """The scheduling policy of the calling thread (Linux), e.g. SCHED_OTHER."""
    if not sys.platform.startswith("linux"):
        return None
    policy = os.sched_getscheduler(0)
    return next((name for name in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
                 if getattr(os, name, None) == policy), str(policy))
