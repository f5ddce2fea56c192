"""Sliced against one-after-another cells, side by side in one run: what each design does to an A/A pair.

    python -m benchmarks.schedule_ab --model results/embedded-cpu/models/target \
        [--draft results/embedded-cpu/models/draft] [--concurrency 16] [--rounds 8] [--slice-ms 30 100]

Three servers of the study's kind: the baseline, its A/A twin and (with --draft) STANDALONE steps2. Each round
measures the study's cell (C warm-up requests, then max(8, C) measured, synthetic T=0) once per design, the
designs in a seeded order:
- `sequential`: one server's cell after another, in a seeded order (the `interleaved` schedule's round);
- `sliced-N`: the three cells at once, each server running in turns of N ms (the `sliced` schedule's round,
  client/slicing.py), each cell read on its server's running clock.
Prints per design and metric the within-round ratios twin ÷ baseline and steps2 ÷ baseline: their geometric mean,
the sd of their logs (the per-round noise that the paired CI divides by sqrt(rounds)) and the 95% paired CI.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import statistics
from contextlib import ExitStack
from pathlib import Path

from workflow_scripts.analysis.paired import paired_ratio
from workflow_scripts.client.cache import cell_metrics
from workflow_scripts.client.cell import CellPlan, CellResult, run_cell_async
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts
from workflow_scripts.client.records import cell_frame
from workflow_scripts.client.rounds import seeded_order
from workflow_scripts.client.slicing import run_together, to_running_clock
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

PARAMS = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64, "ignore_eos": True}
STEPS2 = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
          "speculative_num_draft_tokens": 3}


def _metrics(result: CellResult, name: str, c: int, turns: list[tuple[float, float]] | None) -> dict[str, float]:
    frame = cell_frame(result, name, "synthetic", 0.0, c, 0, "schedule_ab", 0.0)
    return cell_metrics(to_running_clock(frame, turns) if turns is not None else frame)


async def _sequential(urls: dict[str, str], plan: CellPlan, prompts: list, rnd: int) -> dict[str, dict[str, float]]:
    out = {}
    for name in seeded_order(list(urls), "schedule_ab", "sequential", rnd):
        result = await run_cell_async(urls[name], plan, prompts, PARAMS, f"q{rnd}{name}")
        out[name] = _metrics(result, name, plan.concurrency, None)
    return out


def sliced_round(urls: dict[str, str], groups: dict[str, int], plan: CellPlan, prompts: list, rnd: int,
                 slice_ms: float, seed: tuple = ()) -> dict[str, dict[str, float]]:
    """One round of the study's sliced cell on every server at once: each server's metrics on its running clock;
    the servers' turns in a seeded order (`seed`, by default this benchmark's for the round)."""
    order = seeded_order(list(urls), *(seed or ("schedule_ab", "sliced", rnd)))
    sends = {name: functools.partial(run_cell_async, urls[name], plan, prompts, PARAMS, f"s{rnd}{name}")
             for name in order}
    results, turns = run_together(groups, slice_ms / 1000, order, sends)
    return {name: _metrics(result, name, plan.concurrency, turns[name]) for name, result in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target model dir")
    parser.add_argument("--draft", type=Path, help="draft model dir: adds STANDALONE steps2 beside the A/A pair")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--slice-ms", type=float, nargs="+", default=[30.0, 100.0])
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/schedule_ab"))
    args = parser.parse_args()
    if args.rounds < 2 or args.concurrency < 1 or min(args.slice_ms) <= 0:
        parser.error("--rounds must be >= 2, --concurrency >= 1 and every --slice-ms > 0")
    c = args.concurrency
    plan = CellPlan(c, c, max(8, c), incremental=True)
    prompts = synthetic_prompts(load_tokenizer(args.model), 64, 64, seed=1)
    spec = ServerSpec("embedded", str(args.model), str(args.draft) if args.draft else None, "127.0.0.1", 64, 0,
                      incremental_streaming=True)
    members = {"baseline": {}, "baseline_aa": {}, **({"steps2": STEPS2} if args.draft else {})}
    designs = ["sequential", *(f"sliced-{ms:g}" for ms in args.slice_ms)]
    measured: dict[str, list[dict[str, dict[str, float]]]] = {d: [] for d in designs}
    with ExitStack() as stack:
        urls, groups = {}, {}
        for name, setting in members.items():
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            server = stack.enter_context(ServerProcess(build_command(spec, setting, port),
                                                       args.log_dir / f"{name}.log", urls[name], 300))
            groups[name] = server.proc.pid
        for name, url in urls.items():  # the study's server warm-up: one unrecorded wave
            asyncio.run(run_cell_async(url, CellPlan(c, 0, c, incremental=True), prompts, PARAMS, f"w{name}"))
        for rnd in range(args.rounds):
            for design in seeded_order(designs, "schedule_ab", rnd):
                if design == "sequential":
                    measured[design].append(asyncio.run(_sequential(urls, plan, prompts, rnd)))
                else:
                    slice_ms = float(design.split("-")[1])
                    measured[design].append(sliced_round(urls, groups, plan, prompts, rnd, slice_ms))
            print(f"round {rnd}: " + "; ".join(
                f"{d} " + ", ".join(f"{n} {measured[d][-1][n]['aggregate_tok_s']:.0f}" for n in members)
                for d in designs), flush=True)
    print(f"\nC={c}, {args.rounds} rounds; within-round ratios against the baseline")
    print("| design | metric | ratio | geometric mean | sd(log) per round | 95% paired CI |")
    print("|---|---|---|---|---|---|")
    for design in designs:
        for metric in ("aggregate_tok_s", "per_request_tok_s"):
            for name in [n for n in members if n != "baseline"]:
                ctrl = [r["baseline"][metric] for r in measured[design]]
                cand = [r[name][metric] for r in measured[design]]
                logs = [math.log(b / a) for a, b in zip(ctrl, cand)]
                p = paired_ratio(ctrl, cand)
                print(f"| {design} | {metric} | {name} ÷ baseline | {math.exp(statistics.mean(logs)):.3f} | "
                      f"{statistics.stdev(logs):.3f} | {p.diff_pct:+.1f}% [{p.ci_low_pct:+.1f}, {p.ci_high_pct:+.1f}] |")


if __name__ == "__main__":
    main()
