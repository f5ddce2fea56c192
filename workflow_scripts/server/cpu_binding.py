"""SGLang's `SGLANG_CPU_OMP_THREADS_BIND` for the embedded server: the engine's compute on the cores it names,
everything that only waits on a socket (the front's HTTP, tokenizer and detokenizer, the engine process's own
I/O threads) on the others.

SGLang's CPU backend reads the variable as one group of cores per tensor-parallel rank ("0-39|43-82"), binds each
rank's OpenMP compute threads to its group and leaves the remaining cores "for other tasks". The embedded engine
runs one rank: its scheduling thread (which runs the forwards, and torch's pools) goes on the group
(`engine.engine_process.compute_and_io_cores`). Unbound, the kernel may wake the front, a ZMQ I/O thread or a
client on the core a forward runs on, and each wake-up takes that core from the forward.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

ENV = "SGLANG_CPU_OMP_THREADS_BIND"


class CpuBindingError(ValueError):
    """A value of SGLANG_CPU_OMP_THREADS_BIND the server refuses; the message names the variable."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """A Linux cpulist ("1", "0-3,6"); ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first:
            raise ValueError(part)
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def engine_cpus(environ: Mapping[str, str] = os.environ) -> frozenset[int] | None:
    """The cores the engine process is bound to, None where the variable is unset, empty or "all" (SGLang's
    default: no binding); raises CpuBindingError naming the variable."""
    value = environ.get(ENV, "").strip()
    if value in ("", "all"):
        return None
    if "|" in value:
        raise CpuBindingError(f"{ENV}={value!r}: the embedded engine runs one rank, so one group of cores, "
                              f"without '|'")
    try:
        cpus = parse_cpu_list(value)
    except ValueError:
        raise CpuBindingError(f"{ENV}={value!r}: not a list of cores such as '1' or '0-3,6'") from None
    available = os.sched_getaffinity(0)
    if missing := sorted(cpus - available):
        raise CpuBindingError(f"{ENV}={value!r}: core(s) {missing} are not available to this process "
                              f"(available: {sorted(available)})")
    return cpus


def bind_front(cpus: Collection[int] | None) -> None:
    """Move this process (call it before it starts any thread: threads inherit it) off the engine's cores, where
    any core is left; with the engine bound to every core, the front stays where it is."""
    if cpus and (rest := os.sched_getaffinity(0) - set(cpus)):
        os.sched_setaffinity(0, rest)
