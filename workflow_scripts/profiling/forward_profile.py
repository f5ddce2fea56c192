"""What one speculative step costs against a plain decode step, per concurrency and draft count, in the engine itself.

    python -m workflow_scripts.profiling.forward_profile --target results/embedded-cpu/models/target \
        --draft results/embedded-cpu/models/draft --concurrency 1 4 16 32 64 --max-steps 6 --out profile.csv

The cost model (analysis/cost_model/) used to take a step of k drafts as 1 + o + s_C·k plain decode steps: linear
in k. The engine's step is not. At C=64 a verify carries 64·(k+1) tokens, where the MoE is compute-bound and its
blocking (`block_m` tokens a pass over the expert weights, 256 by default) adds a pass past 256 tokens: the step
cost the study measured at synthetic C=64 jumps between steps 3 and 4, and a line through steps 1-3 over-predicts
steps 4 and 5 there (docs/cost_model.md).

So this runs the embedded engine in-process (engine/scheduler.py, one engine per step count, k = 0 the plain one,
with the MoE configs the drafting settings run) and reads its own forward counters, as the server's /metrics reports
them: per (C, k), C random-id prompts (T=0, ignore_eos) are prefilled together, and the seconds per decode forward
are counted from the moment every row has its first token to the first row's finish, the window where all C rows
decode (the drain, with fewer rows, is left out); a measurement repeats the cell until its windows hold
`--min-seconds` of forwards, so that the small, fast cells are not the noisiest. The engine thread's CPU clock is
read where torch runs on that thread alone (a core taken by another process then costs nothing), else the wall
clock. The sizes of one C run as a block, every k in a shuffled order, and a step's cost is taken against the plain
step of its own block: the host's memory speed moves by tens of percent within a minute, and a ratio of two sizes
measured seconds apart sees less of it than one of two medians over the whole run. `step_cost` = the median of those
ratios over the repeats (k = 0: 1), and `step_cost_low`/`step_cost_high` a distribution-free interval of that
median: the j-th lowest and j-th highest ratio, j as large as keeps its coverage at 1 − 2^(−4) or more (the lowest
and highest at 5 repeats, the 2nd at 9, the 4th at 15), whatever the noise's shape. At C=1 a step is ~3.5 ms, so
five repeats leave its shape to the host's drift; the default is 9 (docs/measurements/cost_model_check.md).
`seconds` is the median seconds per decode forward. The cost model takes the shape of that curve in k, fits its
scale to the study's throughput, and widens the stated error of a step it never measured by that range.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from scipy.stats import binom

from workflow_scripts.io import atomic_write_text
from workflow_scripts.engine.scheduler import Scheduler
from workflow_scripts.engine.types import SamplingParams, SpecConfig, TokenEvent
from workflow_scripts.profiling import FORWARD_PROFILE_COLUMNS

log = logging.getLogger(__name__)
COLUMNS = list(FORWARD_PROFILE_COLUMNS)
PROMPT_LEN = 32
MEDIAN_COVERAGE = 1 - 2**-4  # the coverage of the lowest-to-highest range over 5 repeats, the old default
TIMEOUT_S = 600.0


def engines(target: Path, draft: Path, max_steps: int, slots: int, threads: int, dtype: str) -> dict[int, Scheduler]:
    """One started engine per step count: k = 0 plain, k >= 1 STANDALONE with k drafts (SGLang's flag values)."""
    out = {k: Scheduler(target, SpecConfig("STANDALONE", k, 1, k + 1, draft) if k else None, slots, 0,
                     num_threads=threads, dtype=dtype) for k in range(max_steps + 1)}
    for engine in out.values():
        engine.start()
    return out


def decode_seconds(engine: Scheduler) -> tuple[float, int]:
    """(seconds of the engine's decode forwards so far, by the clock that holds them whole; their count)."""
    stats = engine.stats()
    clock = "total_decode_cpu_seconds" if stats["forward_cpu_clock_whole"] else "total_decode_seconds"
    return stats[clock], stats["total_decode_forwards"]


def full_batch_steps(engine: Scheduler, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    """(seconds, count) of the decode forwards that ran while every one of the prompts' rows decoded (from the
    forward that gave the last of them its first token to the one that finished the first), all submitted at once."""
    marks: list[tuple[float, int]] = []
    started: set[str] = set()
    finished = threading.Semaphore(0)
    lock = threading.Lock()

    def sink(event: TokenEvent) -> None:
        with lock:  # the engine thread calls it; the counters are up to date with the forward that made the event
            if event.rid not in started and event.new_ids:
                started.add(event.rid)
                if len(started) == len(prompts):
                    marks.append(decode_seconds(engine))
            if event.finished:
                if len(marks) == 1:
                    marks.append(decode_seconds(engine))
                finished.release()

    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    tag = time.monotonic_ns()
    for i, prompt in enumerate(prompts):
        engine.submit(f"profile-{tag}-{i}", prompt, params, sink)
    for _ in prompts:
        if not finished.acquire(timeout=TIMEOUT_S):
            raise RuntimeError(f"the engine did not finish {len(prompts)} requests within {TIMEOUT_S:.0f} s")
    (s0, n0), (s1, n1) = marks
    if n1 <= n0:
        raise RuntimeError(f"no decode forward while all {len(prompts)} rows ran: raise --new-tokens")
    return s1 - s0, n1 - n0


def seconds_per_step(engine: Scheduler, prompts: list[list[int]], new_tokens: int, min_seconds: float) -> float:
    """Seconds per decode forward over as many cells as it takes to hold `min_seconds` of full-batch forwards: a
    cell at C=1 holds a few milliseconds of them, at C=64 seconds, and each measurement should weigh alike."""
    seconds, forwards = 0.0, 0
    while not forwards or seconds < min_seconds:
        s, n = full_batch_steps(engine, prompts, new_tokens)
        seconds, forwards = seconds + s, forwards + n
    return seconds / forwards


def profile(target: Path, draft: Path, concurrencies: Sequence[int], max_steps: int, repeats: int,
            new_tokens: int, threads: int, dtype: str = "auto", min_seconds: float = 0.5,
            seed: int = 0) -> pd.DataFrame:
    """Median seconds per decode forward per (C, k), k = 0 (plain decode) .. max_steps, and each ÷ the plain one
    at its C."""
    running = engines(target, draft, max_steps, max(concurrencies), threads, dtype)
    try:
        vocab = running[0].vocab_size
        prompt_rng = torch.Generator().manual_seed(seed)
        prompts = torch.randint(2, vocab, (max(concurrencies), PROMPT_LEN), generator=prompt_rng).tolist()
        for engine in running.values():  # one untimed cell each: first-touch allocations, the MoE config lookup
            full_batch_steps(engine, prompts[:1], new_tokens)
        times: dict[tuple[int, int], list[float]] = {(c, k): [] for c in concurrencies for k in running}
        costs: dict[tuple[int, int], list[float]] = {size: [] for size in times}
        rng = random.Random(seed)
        for r in range(repeats):
            for c in rng.sample(list(concurrencies), len(concurrencies)):
                # a block of one C: every k, the plain one among them, in a shuffled order, seconds apart, and each
                # step's cost taken against the plain step of its own block (a drift between blocks cancels)
                block = {k: seconds_per_step(running[k], prompts[:c], new_tokens, min_seconds)
                         for k in rng.sample(list(running), len(running))}
                for k, seconds in block.items():
                    times[(c, k)].append(seconds)
                    costs[(c, k)].append(seconds / block[0])
            log.info("repeat %d of %d done", r + 1, repeats)
    finally:
        for engine in running.values():
            engine.stop()
    rows = [{"concurrency": c, "steps": k, "seconds": statistics.median(times[(c, k)]),
             "step_cost": statistics.median(costs[(c, k)]),
             **dict(zip(("step_cost_low", "step_cost_high"), median_interval(costs[(c, k)])))}
            for c, k in sorted(times)]
    return pd.DataFrame(rows, columns=COLUMNS)


def median_interval(values: Sequence[float], coverage: float = MEDIAN_COVERAGE) -> tuple[float, float]:
    """The order-statistic interval of the median: (j-th lowest, j-th highest) with the largest j whose coverage,
    1 − 2·P(Binomial(n, ½) < j), is at least `coverage`; the lowest and highest where none reaches it."""
    ordered = sorted(values)
    n = len(ordered)
    j = 1
    while j < (n + 1) // 2 and 1 - 2 * binom.cdf(j, n, 0.5) >= coverage:
        j += 1
    return ordered[j - 1], ordered[n - j]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", required=True)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each request decodes (ignore_eos)")
    parser.add_argument("--repeats", type=int, default=9, help="measurements per size (their median)")
    parser.add_argument("--min-seconds", type=float, default=0.5,
                        help="full-batch forward seconds one measurement holds at least (cells are repeated)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the study's servers run one)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--moe-installed", type=Path, default=None,
                        help="installed.json of the MoE install rule: profile with the tuned configs the drafting "
                             "settings run (without it, the engine's default config, as `moe_config: default`)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for flag, value, low in (("--max-steps", args.max_steps, 1), ("--new-tokens", args.new_tokens, 2),
                             ("--repeats", args.repeats, 1), ("--threads", args.threads, 1),
                             ("--concurrency", min(args.concurrency), 1), ("--min-seconds", args.min_seconds, 0)):
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the MoE configs a server of the family sees (client/servers.py sets the same variable)
    if args.moe_installed:
        os.environ["SGLANG_MOE_CONFIG_DIR"] = json.loads(args.moe_installed.read_text())["config_dir"]
    else:
        os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
    t0 = time.perf_counter()
    table = profile(args.target, args.draft, sorted(set(args.concurrency)), args.max_steps, args.repeats,
                    args.new_tokens, args.threads, args.dtype, args.min_seconds)
    atomic_write_text(args.out, table.to_csv(index=False))
    log.info("profiled %d sizes × %d repeats in %.0f s: %s", len(table), args.repeats, time.perf_counter() - t0,
             args.out)
    print(table.pivot(index="steps", columns="concurrency", values="step_cost").round(2).to_string())


if __name__ == "__main__":
    main()
