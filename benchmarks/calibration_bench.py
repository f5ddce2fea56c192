"""Fixed-acceptance calibration and adaptive speculation on the embedded engine, measured side by side in one run.

Engines are driven in-process (engine/closed_loop.py), every cell of a repeat interleaved across the engines:
- the baseline (no speculation);
- STANDALONE steps k with SGLANG_SIMULATE_ACC_LEN=a (real draft tokens): r(k, C) = a' ÷ speedup is the step cost in
  plain decode steps, a' the cell's own tokens per verify; at one k, two acceptances must give one r;
- STANDALONE steps k with the draft's real acceptance: its speedup against E_measured ÷ r(k, C), the calibrated
  prediction, and against (k + 1) ÷ r(k, C), the bound at perfect acceptance;
- adaptive (SGLang's rule over the static steps' tiers, one batch-size entry) against the best static steps, and
  adaptive with the middle steps as its only tier against those static steps: the cost of enabling it.

    python benchmarks/calibration_bench.py --target /work/smoke_pair/target --draft /work/smoke_pair/draft
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from workflow_scripts.engine.closed_loop import run_cell  # noqa: E402
from workflow_scripts.engine.scheduler import Scheduler  # noqa: E402
from workflow_scripts.engine.simulated_acceptance import ENV_LEN, ENV_TOKEN_MODE  # noqa: E402
from workflow_scripts.engine.types import SamplingParams, SpecConfig  # noqa: E402


def build(target: Path, draft: Path, steps: int, acc: float | None, adaptive: dict | None, slots: int) -> Scheduler:
    """An engine with SGLANG_SIMULATE_ACC_LEN set only while it reads it (at construction)."""
    os.environ.pop(ENV_LEN, None)
    if acc is not None:
        os.environ[ENV_LEN], os.environ[ENV_TOKEN_MODE] = str(acc), "real-draft-token"
    spec = SpecConfig("STANDALONE", steps, 1, steps + 1, draft, adaptive_config=adaptive) if steps else None
    engine = Scheduler(target, spec, slots, 0, num_threads=1)
    os.environ.pop(ENV_LEN, None)
    engine.start()
    return engine


def aggregate(engine: Scheduler, prompts: list[list[int]], params: SamplingParams, c: int) -> tuple[float, float]:
    """(aggregate tok/s, tokens per verify) of one closed-loop cell."""
    t0 = time.perf_counter()
    done = run_cell(engine, prompts, params, c)
    tokens = sum(r.tokens for r in done)
    verifies = sum(r.final.spec_verify_ct for r in done)
    return tokens / (max(t for r in done for t in r.times) - t0), (tokens - len(done)) / verifies if verifies else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--requests-per-slot", type=int, default=4, help="a cell runs this many requests per concurrency")
    args = p.parse_args()
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    tiers = {"warmup_batches": 5, "update_interval": 5, "1": {"candidate_steps": sorted(args.steps)}}
    setups = {"baseline": (0, None, None)}
    for k in args.steps:
        setups[f"steps{k}"] = (k, None, None)
        setups[f"cal{k}_acc2"] = (k, 2.0, None)
    setups[f"cal{args.steps[-1]}_acc{args.steps[-1] + 1}"] = (args.steps[-1], float(args.steps[-1] + 1), None)
    middle = args.steps[len(args.steps) // 2]
    setups["adaptive"] = (middle, None, tiers)
    setups[f"adaptive_only{middle}"] = (middle, None, {"1": {"candidate_steps": [middle]}})
    slots = max(args.concurrency)
    engines = {name: build(args.target, args.draft, k, a, ad, slots) for name, (k, a, ad) in setups.items()}
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for rep in range(args.repeats):
            for c in args.concurrency:
                prompts = [torch.randint(3, 400, (32,)).tolist() for _ in range(args.requests_per_slot * c)]
                for name, engine in engines.items():
                    results.setdefault((name, c), []).append(aggregate(engine, prompts, params, c))
    finally:
        for engine in engines.values():
            engine.stop()
    print(f"{'setting':<16}{'C':>4}{'tok/s':>9}{'speedup':>9}{'tok/verify':>11}{'r(k,C)':>8}{'pred':>7}{'bound':>7}")
    for c in args.concurrency:
        base = statistics.median(v for v, _ in results[("baseline", c)])
        costs: dict[int, list[float]] = {}
        rows = []
        for name, (k, acc, ad) in setups.items():
            tok_s = statistics.median(v for v, _ in results[(name, c)])
            e = statistics.median(x for _, x in results[(name, c)])
            speedup = tok_s / base
            if acc is not None:
                costs.setdefault(k, []).append(e / speedup)
            rows.append((name, k, acc, ad, tok_s, speedup, e))
        for name, k, acc, ad, tok_s, speedup, e in rows:
            r = statistics.mean(costs[k]) if k in costs else float("nan")
            pred, bound = (e / r, (k + 1) / r) if acc is None and ad is None and k else (float("nan"),) * 2
            print(f"{name:<16}{c:>4}{tok_s:>9.1f}{speedup:>9.3f}{e:>11.2f}{r:>8.3f}{pred:>7.3f}{bound:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
