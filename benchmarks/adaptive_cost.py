"""What the adaptive path costs when it runs fixed tiers, in-process and side by side in one run.

    python -m benchmarks.adaptive_cost --target results/embedded-cpu/models/target \
        --draft results/embedded-cpu/models/draft \
        [--schedule results/embedded-cpu/deploy/synthetic/sglang_adaptive.json] [--steps 3] \
        [--concurrency 1,4,16] [--repeats 8]

A deployed schedule measured about 1% below the static setting with its band's steps in the served schedule check
(docs/deployment.md). This benchmark drives the Scheduler directly (engine/closed_loop.py: no server, no client),
so what is left is the engine's own adaptive path: the batch-size routing, the EMA bookkeeping, draft caches sized
for the largest tier, and a draft that catches up after a 0-step tier. Engines, all in one process:
- `static`: STANDALONE with `--steps` steps, and one static engine per other tier of the schedule (0: none);
- `adaptive`: the same steps through the adaptive path, one tier for every batch size;
- `schedule` (with `--schedule`): the deploy's SGLang adaptive config.
Each repeat runs every concurrency once on every engine, the engines in a seeded order; a cell keeps C requests in
flight (max(8, C) requests of 64 synthetic tokens, 64 new tokens, T=0, ignore_eos). Prints per concurrency the
aggregate tok/s ratio, paired by repeat with its 95% CI, of `adaptive` ÷ `static` and of `schedule` ÷ the static
engine with the steps the schedule runs at that concurrency.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from workflow_scripts.analysis.paired import paired_ratio  # noqa: E402
from workflow_scripts.analysis.thresholds import fixed_tiers, steps_at  # noqa: E402
from workflow_scripts.engine.adaptive import load_adaptive_config  # noqa: E402
from workflow_scripts.engine.closed_loop import run_cell  # noqa: E402
from workflow_scripts.engine.scheduler import Scheduler  # noqa: E402
from workflow_scripts.engine.types import SamplingParams, SpecConfig  # noqa: E402
from workflow_scripts.machine import stream_bandwidth_gbs  # noqa: E402

PARAMS = SamplingParams(temperature=0.0, max_new_tokens=64, ignore_eos=True)


def static(steps: int, draft: Path) -> SpecConfig | None:
    """STANDALONE with `steps` steps; None (no speculation) for 0."""
    return SpecConfig("STANDALONE", steps, 1, steps + 1, draft) if steps else None


def ratio_text(values: dict[str, list[float]], cand: str, base: str) -> str:
    r = paired_ratio(np.array(values[base]), np.array(values[cand]))
    return f"{r.diff_pct / 100 + 1:.3f} [{r.ci_low_pct / 100 + 1:.3f}, {r.ci_high_pct / 100 + 1:.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, type=Path, help="target model directory")
    ap.add_argument("--draft", required=True, type=Path, help="draft model directory")
    ap.add_argument("--schedule", type=Path, help="a deploy's sglang_adaptive.json (one tier per batch-size entry)")
    ap.add_argument("--steps", type=int, default=3, help="the static and fixed-tier adaptive engines' steps")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrencies")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine (the study's servers: 1)")
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats: at least 2 (a confidence interval needs two pairs)")
    if args.steps < 1:
        ap.error("--steps: at least 1")
    for flag, path in (("--target", args.target), ("--draft", args.draft)):
        if not (path / "config.json").is_file():
            ap.error(f"{flag}: no model at {path} (config.json missing)")
    tiers = None
    if args.schedule is not None:
        try:
            tiers = fixed_tiers(load_adaptive_config(args.schedule))
        except (OSError, ValueError) as err:
            ap.error(f"--schedule: {args.schedule}: {err}")
        if tiers is None:
            ap.error(f"--schedule: {args.schedule} has an entry with several tiers; a schedule has one per entry")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    statics = sorted({args.steps, *(tiers.values() if tiers else ())})
    specs: dict[str, SpecConfig | None] = {f"static{k}": static(k, args.draft) for k in statics}
    specs["adaptive"] = SpecConfig("STANDALONE", args.steps, 1, args.steps + 1, args.draft,
                                   {"1": {"candidate_steps": [args.steps]}})
    if tiers:
        specs["schedule"] = SpecConfig("STANDALONE", max(tiers.values()), 1, max(tiers.values()) + 1, args.draft,
                                       load_adaptive_config(args.schedule))
    max_c = max(concurrencies + [8])
    engines = {name: Scheduler(args.target, spec, max_c, 0, num_threads=args.threads) for name, spec in specs.items()}
    for engine in engines.values():
        engine.start()
    print(f"machine: streaming memory bandwidth {stream_bandwidth_gbs():.1f} GB/s; engines {list(engines)}; "
          f"{args.repeats} repeats; {args.threads} torch thread(s) each")
    rng = random.Random(0)
    vocab = engines["adaptive"].vocab_size
    tok_s: dict[int, dict[str, list[float]]] = {c: {name: [] for name in engines} for c in concurrencies}
    try:
        with tqdm(total=args.repeats * len(concurrencies) * len(engines), desc="cells", unit="cell") as bar:
            for _ in range(args.repeats):
                for c in concurrencies:
                    prompts = [[rng.randrange(10, vocab) for _ in range(64)] for _ in range(max(8, c))]
                    for name in rng.sample(list(engines), len(engines)):
                        started = time.perf_counter()
                        done = run_cell(engines[name], prompts, PARAMS, c)
                        tok_s[c][name].append(sum(r.tokens for r in done) / (time.perf_counter() - started))
                        bar.update()
    finally:
        for engine in engines.values():
            engine.stop()
    for c in concurrencies:
        medians = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in tok_s[c].items())
        line = f"C={c}: aggregate tok/s (median) {medians}; adaptive ÷ static{args.steps} " \
               f"{ratio_text(tok_s[c], 'adaptive', f'static{args.steps}')}"
        if tiers:
            k = steps_at(tiers, c)
            line += f"; schedule ({k} steps here) ÷ static{k} {ratio_text(tok_s[c], 'schedule', f'static{k}')}"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
