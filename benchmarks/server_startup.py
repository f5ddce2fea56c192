"""How long the embedded server takes from its start to its first answered generation, against another commit.

    python -m benchmarks.server_startup --model results/smoke/models/target [--draft results/smoke/models/draft] \
        [--baseline-ref HEAD~1] [--starts 8]

A study starts every member's server at least twice per cohort (the launch order reversed after the first round),
and the test suite starts a few hundred: start-up is time nobody measures. Each start runs
`python -m workflow_scripts.engine.launch_server` from a source tree (this checkout, or `--baseline-ref` checked
out into a temporary git worktree), polls /health_generate as the launcher does (`READY_POLL_S`), and records the
seconds until it answers 200; then the server is stopped. The two trees alternate, the order swapped each pair, so
a slower stretch of a shared machine falls on both. Prints each tree's median and the paired ratio (this tree ÷
baseline) with its 95% CI over the pairs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from workflow_scripts.analysis.paired import paired_ratio
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port
from workflow_scripts.machine import stream_bandwidth_gbs

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 120.0


def worktree(stack: ExitStack, ref: str) -> Path:
    """`ref` checked out into a temporary worktree, removed on exit."""
    path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="startup-"))) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), ref], check=True)
    stack.callback(subprocess.run, ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=True)
    return path


def seconds_to_ready(tree: Path, argv: list[str], port: int, log_path: Path) -> float:
    """Start the server from `tree` (python -m finds the package in its working directory), time it to its first
    answered generation, stop it."""
    server = ServerProcess(argv, log_path, f"http://127.0.0.1:{port}", STARTUP_TIMEOUT_S, cwd=tree)
    started = time.perf_counter()
    with server:
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path,
                    help="target model directory (e.g. results/smoke/models/target)")
    ap.add_argument("--draft", type=Path, help="draft model: the servers then run STANDALONE with 2 steps")
    ap.add_argument("--baseline-ref", default="HEAD", help="git ref to compare this checkout against (default HEAD)")
    ap.add_argument("--starts", type=int, default=8, help="starts per tree")
    args = ap.parse_args(argv)
    if args.starts < 2:
        ap.error("--starts: at least 2 (a confidence interval needs two pairs)")
    for flag, path in (("--model", args.model), ("--draft", args.draft)):
        if path is not None and not (path / "config.json").is_file():
            ap.error(f"{flag}: no model at {path} (config.json missing)")
    spec = ServerSpec("embedded", str(args.model.resolve()), str(args.draft.resolve()) if args.draft else None,
                      "127.0.0.1", 8, 0, num_threads=1, incremental_streaming=True)
    setting = ({"speculative_algorithm": "STANDALONE", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 3} if args.draft else {})
    print(f"machine: streaming memory bandwidth {stream_bandwidth_gbs():.1f} GB/s; "
          f"{'STANDALONE 2 steps' if args.draft else 'no speculation'}; {args.starts} starts per tree")
    times: dict[str, list[float]] = {"this": [], "baseline": []}
    with ExitStack() as stack:
        trees = {"this": REPO, "baseline": worktree(stack, args.baseline_ref)}
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="startup-logs-")))
        for start in range(args.starts):
            order = ["this", "baseline"] if start % 2 == 0 else ["baseline", "this"]
            for name in order:
                port = free_port()
                times[name].append(seconds_to_ready(trees[name], build_command(spec, setting, port), port,
                                                    log_dir / f"{name}.log"))
            print(f"  pair {start + 1}: this {times['this'][-1]:.2f} s, baseline {times['baseline'][-1]:.2f} s",
                  flush=True)
    ratio = paired_ratio(np.array(times["baseline"]), np.array(times["this"]))
    print(f"median seconds to ready: this {statistics.median(times['this']):.2f}, "
          f"baseline ({args.baseline_ref}) {statistics.median(times['baseline']):.2f}")
    print(f"this ÷ baseline: {ratio.diff_pct / 100 + 1:.3f} (95% CI {ratio.ci_low_pct / 100 + 1:.3f}-"
          f"{ratio.ci_high_pct / 100 + 1:.3f}, {ratio.rounds} pairs)")


if __name__ == "__main__":
    sys.exit(main())
