"""Does memory that sits longer in the guest read slower? Two host-side suspects for the start-position effect.

    python -m benchmarks.page_aging merge [--mb 1024] [--samples 24] [--every-s 30]
    python -m benchmarks.page_aging idle [--mb 512] [--idle-s 60 240 480]

A study's servers hold the same weights byte for byte, and the first-started waits longest before it is measured
(docs/measurements/launch_order.md). Two things the host might do to such pages, invisible from inside the guest:
- `merge`: a host merging identical pages (KSM) would share two equal buffers, slowing their reads over time
  against a buffer of unique content, and the first write to a merged page would cost a host copy-on-write
  fault (microseconds) instead of a plain store (~10 ns);
- `idle`: a host reclaiming pages the guest has not touched for minutes would make the first read of an idle
  buffer much slower than the next one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

PAGE = 4096


def buffer(mb: int, seed: int) -> np.ndarray:
    """`mb` megabytes of touched random content (equal seeds give equal bytes)."""
    return np.random.default_rng(seed).integers(0, 2**62, mb * 2**20 // 8, dtype=np.int64)


def read_seconds(a: np.ndarray) -> float:
    t = time.perf_counter()
    a.sum()
    return time.perf_counter() - t


def read_gbs(a: np.ndarray, passes: int = 3) -> float:
    return a.nbytes / min(read_seconds(a) for _ in range(passes)) / 1e9


def merge(mb: int, samples: int, every_s: float) -> None:
    bufs = {"dup_a": buffer(mb, 7), "dup_b": buffer(mb, 7), "unique": buffer(mb, time.time_ns())}
    t0 = time.time()
    for _ in range(samples):
        print(f"{time.time() - t0:6.0f}s " + " ".join(f"{k}={read_gbs(v):5.2f}" for k, v in bufs.items()) + " GB/s",
              flush=True)
        time.sleep(every_s)
    for name, a in bufs.items():
        view = a.view(np.uint8)
        t = time.perf_counter()
        view[::PAGE] += 1
        dt = time.perf_counter() - t
        print(f"first write, one byte per page, {name}: {dt * 1e3:.1f} ms ({dt / (a.nbytes / PAGE) * 1e9:.0f} ns/page)",
              flush=True)


def idle(mb: int, waits: list[float]) -> None:
    bufs = [buffer(mb, i) for i in range(len(waits))]
    t0 = time.time()
    for a, wait in zip(bufs, sorted(waits)):
        time.sleep(max(0.0, wait - (time.time() - t0)))
        first, second, third = (read_seconds(a) for _ in range(3))
        print(f"idle {wait:4.0f}s: first read {first * 1e3:.0f} ms, then {second * 1e3:.0f}, {third * 1e3:.0f} ms",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="probe", required=True)
    m = sub.add_parser("merge", help="two equal buffers against a unique one, then the first write per page")
    m.add_argument("--mb", type=int, default=1024)
    m.add_argument("--samples", type=int, default=24)
    m.add_argument("--every-s", type=float, default=30.0)
    i = sub.add_parser("idle", help="the first read of a buffer left idle against the reads after it")
    i.add_argument("--mb", type=int, default=512)
    i.add_argument("--idle-s", type=float, nargs="+", default=[60.0, 240.0, 480.0])
    args = parser.parse_args()
    if args.mb < 1:
        parser.error("--mb must be >= 1")
    if args.probe == "merge":
        merge(args.mb, args.samples, args.every_s)
    else:
        idle(args.mb, args.idle_s)


if __name__ == "__main__":
    main()
