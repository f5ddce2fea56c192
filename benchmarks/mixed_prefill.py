"""What mixed prefill buys: refills under load, with --enable-mixed-chunk off and on, side by side in one run.

A closed loop keeps `--concurrency` requests in flight (as the study's client does) over `--waves` times as many
requests as there are slots, with output lengths spread over [N/2, 3N/2] so that requests finish at different
steps and a newcomer's prefill lands in the middle of running sequences, all through the run. Per setting
(no speculation, STANDALONE steps 2, ...) and prefill mode, one engine; cells are interleaved within each repeat
and the median over repeats is reported, so machine noise hits both modes alike.

- aggregate tok/s = all output tokens / (last token - first submit);
- step gap = time between two consecutive token events of one running request (its inter-token latency per
  engine step; under speculation one event carries 1..k+1 tokens): p50 and p99 over all requests of a cell.
  A refill without mixing costs every running request one extra forward, which shows in the p99, and is
  counted exactly as "stalling prefill forwards" (prefill-only forwards while sequences were running);
- TTFT p50 = submit to first token;
- tok per CPU-s = output tokens / CPU seconds the process spent on the cell: on a shared machine, what a cell
  costs the engine is steadier than its wall time.

    python benchmarks/mixed_prefill.py --target results/default/models/target --draft results/default/models/draft
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.engine_bench import aggregate_tok_s, make_prompts, md_table, random_pair  # noqa: E402
from workflow_scripts.engine.closed_loop import Timed, run_cell  # noqa: E402
from workflow_scripts.engine.scheduler import Scheduler  # noqa: E402
from workflow_scripts.engine.types import DEFAULT_CHUNKED_PREFILL_SIZE, SamplingParams, SpecConfig  # noqa: E402
from workflow_scripts.io import atomic_write_text  # noqa: E402

MODES = {"separate prefill": False, "mixed prefill": True}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def cell_figures(cell: list[Timed], cpu_s: float) -> dict[str, float]:
    gaps = [g for r in cell for g in r.step_gaps]
    return {
        "aggregate tok/s": aggregate_tok_s(cell),
        "tok per CPU-s": sum(r.tokens for r in cell) / cpu_s,
        "step gap p50 ms": percentile(gaps, 50) * 1e3,
        "step gap p99 ms": percentile(gaps, 99) * 1e3,
        "TTFT p50 ms": statistics.median(r.times[0] - r.submit for r in cell) * 1e3,
    }


def spread_lengths(n: int, new_tokens: int, seed: int) -> list[int]:
    """n output lengths, uniform over [N/2, 3N/2]: finishes spread over the run."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(new_tokens // 2, new_tokens * 3 // 2 + 1, (n,), generator=g).tolist()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, help="target model dir (default: random weights of the default preset's shape)")
    ap.add_argument("--draft", type=Path, help="draft model dir (required with --target)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight = engine slots")
    ap.add_argument("--waves", type=int, default=4, help="requests per cell = waves x concurrency")
    ap.add_argument("--new-tokens", type=int, default=128, help="mean output length N (spread over [N/2, 3N/2])")
    ap.add_argument("--chunked-prefill-size", type=int, default=DEFAULT_CHUNKED_PREFILL_SIZE)
    ap.add_argument("--settings", default="none,steps2", help="none, stepsK (STANDALONE), ngramK")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    args = ap.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        ap.error("--target and --draft go together")
    torch.set_num_threads(args.threads)
    tmp = None
    source = "the given pair"
    if args.target is None:
        tmp = tempfile.TemporaryDirectory()
        args.target, args.draft = random_pair(Path(tmp.name))
        source = "RANDOM weights of the default preset's shape (no built pair given)"
    settings: dict[str, SpecConfig | None] = {}
    for name in args.settings.split(","):
        if name == "none":
            settings[name] = None
        elif name.startswith("steps"):
            k = int(name[5:])
            settings[name] = SpecConfig("STANDALONE", k, 1, k + 1, args.draft)
        elif name.startswith("ngram"):
            k = int(name[5:])
            settings[name] = SpecConfig("NGRAM", k, 1, k + 1, None)
        else:
            ap.error(f"--settings: unknown setting {name!r}")
    C = args.concurrency
    n = C * args.waves
    engines = {(name, mode): Scheduler(args.target, spec, C, 0, num_threads=args.threads, dtype=args.dtype,
                                    chunked_prefill_size=args.chunked_prefill_size, enable_mixed_chunk=mixed)
               for name, spec in settings.items() for mode, mixed in MODES.items()}
    for e in engines.values():
        e.start()
    try:
        vocab = next(iter(engines.values())).vocab_size
        prompts = make_prompts(args.target, n, realistic=True, vocab=vocab)
        params = [SamplingParams(temperature=0.0, max_new_tokens=m, ignore_eos=True)
                  for m in spread_lengths(n, args.new_tokens, seed=1)]
        warm = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
        for e in engines.values():  # warm-up at full width: first-touch costs stay out of the cells
            run_cell(e, prompts[:C], warm, C)
        cells: dict[tuple[str, str], list[dict[str, float]]] = {}
        order = list(engines.items())
        for rep in tqdm(range(args.repeats), desc="cells"):
            for key, engine in order[rep % len(order):] + order[: rep % len(order)]:  # rotate: no engine always first
                cpu = time.process_time()
                cell = run_cell(engine, prompts, params, C)
                cells.setdefault(key, []).append(cell_figures(cell, time.process_time() - cpu))
        stats = {key: e.stats() for key, e in engines.items()}
    finally:
        for e in engines.values():
            e.stop()
        if tmp is not None:
            tmp.cleanup()
    figures = list(next(iter(cells.values()))[0])
    rows = []
    for name in settings:
        base = {f: statistics.median(c[f] for c in cells[(name, "separate prefill")]) for f in figures}
        for mode in MODES:
            med = {f: statistics.median(c[f] for c in cells[(name, mode)]) for f in figures}
            st = stats[(name, mode)]
            mixed_share = st["total_mixed_forwards"] / max(1, st["total_forwards"])
            stalls = st["total_stall_forwards"] / st["num_finished"]
            rows.append([name, mode, *(med[f] for f in figures), med["aggregate tok/s"] / base["aggregate tok/s"],
                         med["tok per CPU-s"] / base["tok per CPU-s"], med["step gap p99 ms"] / base["step gap p99 ms"],
                         f"{mixed_share:.0%}", stalls])
    mean_prompt = statistics.mean(len(p) for p in prompts)
    report = [
        f"# Mixed prefill under refills\n\nPair: `{args.target}` + `{args.draft}` ({source}). Threads: {args.threads}. "
        f"dtype: {args.dtype}. Closed loop at concurrency {C} = slots, {n} requests per cell ({args.waves} waves), "
        f"realistic prompts (mean {mean_prompt:.0f} tokens), T=0 ignore_eos, output lengths uniform in "
        f"[{args.new_tokens // 2}, {args.new_tokens * 3 // 2}]. --chunked-prefill-size {args.chunked_prefill_size}. "
        f"Repeats: {args.repeats} (median). Engine driven in-process.",
        md_table(["setting", "prefill", *figures, "aggregate vs separate", "CPU-s efficiency vs separate",
                  "p99 gap vs separate", "mixed forwards", "stalling prefill forwards per request"], rows),
    ]
    text = "\n\n".join(report) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
