"""How much CPU the benchmark client itself spends, against a real embedded server: the client must never be
the bottleneck.

For each concurrency it runs one cell and reports the server's aggregate tok/s, the client's CPU time per
streamed chunk and per token, and the headroom: the chunk rate one core of client could sustain ÷ the chunk
rate the server produced. A headroom well above 1 means the client is not what limits the measurement.
Then the same cell (same prompts, concurrency and request count) runs on the engine driven in this process,
with no HTTP and no client: "HTTP ÷ in-process" is what the server's HTTP layer and the client cost the study.
Each concurrency runs `--rounds` such pairs back to back, alternating which goes first; the median ratio is the
figure (the machine's load drifts between cells).

    python -m benchmarks.client_overhead --model results/smoke/models/target [--concurrency 1 4 16 64]
        [--streaming incremental|cumulative]

The server is started as the study starts it (`launcher.command.build_command`), streaming incremental deltas
by default (`server.incremental_streaming`).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

# Both sides run one torch thread (the server via --num-threads 1). torch.set_num_threads() does not reach the
# in-process engine's scheduling thread, whose OpenMP pool would otherwise take every core and spin under load.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from benchmarks.engine_bench import aggregate_tok_s  # noqa: E402
from benchmarks.engine_bench import run_cell as run_in_process  # noqa: E402
from workflow_scripts.client.cell import CellPlan, run_cell  # noqa: E402
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts  # noqa: E402
from workflow_scripts.engine.scheduler import Engine  # noqa: E402
from workflow_scripts.engine.types import SamplingParams  # noqa: E402
from workflow_scripts.launcher.command import ServerSpec, build_command  # noqa: E402
from workflow_scripts.launcher.process import ServerProcess, free_port  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target model dir (e.g. results/smoke/models/target)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--streaming", choices=("incremental", "cumulative"), default="incremental",
                        help="the server's streaming mode (--incremental-streaming-output or SGLang's default)")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="HTTP/in-process pairs per concurrency (median ratio)")
    parser.add_argument("--log", type=Path, default=Path("/tmp/client_overhead_server.log"))
    args = parser.parse_args()

    prompts = synthetic_prompts(load_tokenizer(args.model), 64, 32, seed=0)
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.output_len, "ignore_eos": True}
    incremental = args.streaming == "incremental"
    spec = ServerSpec("embedded", str(args.model), None, "127.0.0.1", max(args.concurrency), 0, num_threads=1,
                      incremental_streaming=incremental)
    port = free_port()
    engine = Engine(args.model, None, max(args.concurrency), 0, num_threads=1)
    engine_params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
    print("| C | round | server agg tok/s | chunks | client CPU ms/chunk | client CPU ms/token | client CPU share "
          "| headroom | in-process tok/s | HTTP ÷ in-process |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    medians = {}
    with ServerProcess(build_command(spec, {}, port), args.log, f"http://127.0.0.1:{port}", 300) as _:
        engine.start()
        for c in args.concurrency:
            plan = CellPlan(concurrency=c, warmup=c, measured=4 * c, incremental=incremental)
            ids = [prompts[i % len(prompts)].input_ids for i in range(plan.total)]
            ratios = []
            for rnd in range(args.rounds):
                # alternate which side goes first, so that a drift in the machine's load hits both alike
                if rnd % 2:
                    in_process = aggregate_tok_s(run_in_process(engine, ids, engine_params, c))
                    result = run_cell(f"http://127.0.0.1:{port}", plan, prompts, params, f"c{c}r{rnd}")
                else:
                    result = run_cell(f"http://127.0.0.1:{port}", plan, prompts, params, f"c{c}r{rnd}")
                    in_process = aggregate_tok_s(run_in_process(engine, ids, engine_params, c))
                ratios.append(_report(c, rnd, result, in_process))
            medians[c] = statistics.median(ratios)
        engine.stop()
    print("\nmedian HTTP ÷ in-process: " + ", ".join(f"C={c}: {r:.2f}" for c, r in medians.items()))


def _report(c: int, rnd: int, result, in_process: float) -> float:
    """Print one round's row; returns its HTTP ÷ in-process ratio."""
    chunks = sum(len(r.chunk_ts) for r in result.records)
    tokens = sum(r.output_tokens or 0 for r in result.records)
    errors = [r.error for r in result.records if r.error]
    if errors:
        raise SystemExit(f"c={c}: {len(errors)} requests failed, e.g. {errors[0]}")
    cpu_per_chunk = result.client_cpu_s / chunks
    headroom = (1 / cpu_per_chunk) / (chunks / result.wall_s)
    ratio = tokens / result.wall_s / in_process
    print(
        f"| {c} | {rnd} | {tokens / result.wall_s:.0f} | {chunks} | {1e3 * cpu_per_chunk:.3f} | "
        f"{1e3 * result.client_cpu_s / tokens:.3f} | {result.client_cpu_s / result.wall_s:.0%} | {headroom:.1f}× "
        f"| {in_process:.0f} | {ratio:.2f} |",
        flush=True,
    )
    return ratio

if __name__ == "__main__":
    main()
