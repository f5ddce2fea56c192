"""Does the server launched second measure faster? Two identical servers, their launch order swapped each launch.

    python -m benchmarks.launch_order --model results/embedded-cpu/models/target \
        [--launches 4] [--rounds 4] [--concurrency 16] [--slice-ms 30] [--warm-reversed] [--ballast-mb 0]

The study's A/A twin came out faster than its control in 29 of 30 sliced cells over three runs (1-4% each), and
the study then launched its servers in the same order every time, the control first. Here two servers of one
setting, `a` and `b` (one torch thread each, as the study runs them), are started in the order a, b on even
launches and b, a on odd ones, each warmed up right after its start as the study does, then measured on the
study's sliced cell (`client/slicing.py`, through `benchmarks.schedule_ab.sliced_round`) for `--rounds` rounds.
Prints per launch b ÷ a and second-started ÷ first-started (geometric mean over its rounds), then both over all
launches with the 95% paired CI: if the start order is the cause, the second ratio stays on one side of 1 while the
first flips sign with the launch order. Then the instances' own offset beyond the start order (`instance_spread`).
`--warm-reversed` warms the servers once both are up, the last started first, to tell the start from the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from benchmarks.schedule_ab import PARAMS, sliced_round
from workflow_scripts.analysis.paired import paired_ratio
from workflow_scripts.client.cell import CellPlan, run_cell_async
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port
from workflow_scripts.machine import stream_bandwidth_gbs

METRIC = "aggregate_tok_s"


def ballast(megabytes: int) -> subprocess.Popen:
    """A process holding `megabytes` of touched memory: the pages the last launch freed go to it, not a server."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nimport numpy as np\n"
                             f"held = np.ones({megabytes} * 2**17)\nprint('held', flush=True)\ntime.sleep(1e9)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def measure_launch(spec: ServerSpec, order: list[str], plan: CellPlan, prompts: list, rounds: int, slice_ms: float,
                   log_dir: Path, launch: int, warm_reversed: bool = False,
                   ballast_mb: int = 0) -> list[dict[str, float]]:
    """Start the servers in `order` (after a ballast of `ballast_mb`, freed once they are up), warm each up with one
    wave (right after its start, or with `warm_reversed` once all are up, in the reverse order), then `rounds`
    sliced cells: {server: tok/s} each."""
    warmup = CellPlan(plan.concurrency, 0, plan.concurrency, incremental=True)
    held = ballast(ballast_mb) if ballast_mb else None

    def warm(name: str) -> None:
        asyncio.run(run_cell_async(urls[name], warmup, prompts, PARAMS, f"w{launch}{name}"))

    with ExitStack() as stack:
        urls, groups = {}, {}
        for name in order:
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            server = stack.enter_context(ServerProcess(build_command(spec, {}, port),
                                                       log_dir / f"launch{launch}-{name}.log", urls[name], 300))
            groups[name] = server.proc.pid
            if not warm_reversed:
                warm(name)
        if held is not None:
            held.kill()
            held.wait()
        for name in reversed(order) if warm_reversed else ():
            warm(name)
        return [{name: metrics[METRIC] for name, metrics in
                 sliced_round(urls, groups, plan, prompts, rnd, slice_ms, seed=("launch_order", launch, rnd)).items()}
                for rnd in range(rounds)]


def summary(label: str, pairs: list[tuple[float, float]]) -> str:
    ctrl, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    p = paired_ratio(ctrl, cand)
    gm = math.exp(statistics.mean(math.log(b / a) for a, b in pairs))
    faster = sum(b > a for a, b in pairs)
    return (f"{label}: geometric mean {gm:.3f}, {p.diff_pct:+.1f}% [{p.ci_low_pct:+.1f}, {p.ci_high_pct:+.1f}], "
            f"above 1 in {faster} of {len(pairs)} rounds")


def instance_spread(launches: list[list[tuple[float, float]]]) -> str:
    """How far one instance sits from another beyond round noise and the start order: a one-way random-effects split
    of log(second-started ÷ first-started) per launch.

    The variance of the per-launch means is 2 sigma^2 (sigma: the sd of one instance's offset, what a twin started
    once draws against its control) plus the rounds' own variance over the rounds."""
    logs = [[math.log(b / a) for a, b in launch] for launch in launches]
    rounds = min(len(x) for x in logs)
    if rounds < 2:
        return "instance offset: needs >= 2 rounds per launch"
    between = statistics.variance([statistics.mean(x) for x in logs])
    within = statistics.mean(statistics.variance(x) for x in logs)
    sigma = math.sqrt(max(0.0, between - within / rounds) / 2)
    return (f"instance offset: sd {100 * sigma:.2f}% per instance (launch means' sd {100 * math.sqrt(between):.2f}%, "
            f"round sd {100 * math.sqrt(within):.2f}% over {rounds} rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target model dir")
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="sliced cells per launch")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--slice-ms", type=float, default=30.0)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/launch_order"))
    parser.add_argument("--ballast-mb", type=int, default=0,
                        help="hold this much touched memory while the servers start: do the pages the last launch "
                             "freed make the first-started server slower?")
    parser.add_argument("--warm-reversed", action="store_true",
                        help="warm the servers once all are up, last started first: tells the start order's "
                             "effect from the warm-up's")
    args = parser.parse_args()
    if args.launches < 2 or args.rounds < 1 or args.concurrency < 1 or args.slice_ms <= 0:
        parser.error("--launches must be >= 2, --rounds and --concurrency >= 1, --slice-ms > 0")
    c = args.concurrency
    plan = CellPlan(c, c, max(8, c), incremental=True)
    prompts = synthetic_prompts(load_tokenizer(args.model), 64, 64, seed=1)
    spec = ServerSpec("embedded", str(args.model), None, "127.0.0.1", 64, 0, num_threads=1, incremental_streaming=True)
    print(f"machine: {stream_bandwidth_gbs():.1f} GB/s streaming (one thread)", flush=True)
    by_name, by_start, by_launch = [], [], []
    for launch in range(args.launches):
        order = ["a", "b"] if launch % 2 == 0 else ["b", "a"]
        rounds = measure_launch(spec, order, plan, prompts, args.rounds, args.slice_ms, args.log_dir, launch,
                                args.warm_reversed, args.ballast_mb)
        by_name += [(r["a"], r["b"]) for r in rounds]
        by_start += [(r[order[0]], r[order[1]]) for r in rounds]
        by_launch.append([(r[order[0]], r[order[1]]) for r in rounds])
        print(f"launch {launch} (started {', '.join(order)}): " + "; ".join(
            f"a {r['a']:.0f}, b {r['b']:.0f}" for r in rounds), flush=True)
        print("  " + summary("b ÷ a", [(r["a"], r["b"]) for r in rounds]), flush=True)
    print(f"\nC={c}, {args.launches} launches × {args.rounds} sliced rounds, {METRIC}")
    print(summary("b ÷ a (the name)", by_name))
    print(summary("second-started ÷ first-started", by_start))
    print(instance_spread(by_launch))
    print(f"mean {METRIC}: {statistics.mean(x for pair in by_name for x in pair):.1f}")


if __name__ == "__main__":
    main()
