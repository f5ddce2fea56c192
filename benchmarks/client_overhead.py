"""How much CPU the benchmark client itself spends, against a real embedded server: the client must never be
the bottleneck.

For each concurrency it runs one cell and reports the server's aggregate tok/s, the client's CPU time per
streamed chunk and per token, and the headroom: the chunk rate one core of client could sustain ÷ the chunk
rate the server produced. A headroom well above 1 means the client is not what limits the measurement.
Then the same cell (same prompts, concurrency and request count) runs on the engine driven in this process,
with no HTTP and no client: "HTTP ÷ in-process" is what the server's HTTP layer and the client cost the study.

    python -m benchmarks.client_overhead --model results/smoke/models/target [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.engine_bench import aggregate_tok_s
from benchmarks.engine_bench import run_cell as run_in_process
from workflow_scripts.client.cell import CellPlan, run_cell
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts
from workflow_scripts.engine.scheduler import Engine
from workflow_scripts.engine.types import SamplingParams
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target model dir (e.g. results/smoke/models/target)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--log", type=Path, default=Path("/tmp/client_overhead_server.log"))
    args = parser.parse_args()

    prompts = synthetic_prompts(load_tokenizer(args.model), 64, 32, seed=0)
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.output_len, "ignore_eos": True}
    spec = ServerSpec("embedded", str(args.model), None, "127.0.0.1", max(args.concurrency), 0, num_threads=1)
    port = free_port()
    engine = Engine(args.model, None, max(args.concurrency), 0, num_threads=1)
    engine_params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
    print("| C | server agg tok/s | chunks | client CPU ms/chunk | client CPU ms/token | client CPU share | headroom "
          "| in-process tok/s | HTTP ÷ in-process |")
    print("|---|---|---|---|---|---|---|---|---|")
    with ServerProcess(build_command(spec, {}, port), args.log, f"http://127.0.0.1:{port}", 300) as _:
        engine.start()
        for c in args.concurrency:
            plan = CellPlan(concurrency=c, warmup=c, measured=4 * c)
            result = run_cell(f"http://127.0.0.1:{port}", plan, prompts, params, f"c{c}")
            in_process = aggregate_tok_s(
                run_in_process(engine, [prompts[i % len(prompts)].input_ids for i in range(plan.total)], engine_params, c)
            )
            chunks = sum(len(r.chunk_ts) for r in result.records)
            tokens = sum(r.output_tokens or 0 for r in result.records)
            errors = [r.error for r in result.records if r.error]
            if errors:
                raise SystemExit(f"c={c}: {len(errors)} requests failed, e.g. {errors[0]}")
            cpu_per_chunk = result.client_cpu_s / chunks
            headroom = (1 / cpu_per_chunk) / (chunks / result.wall_s)
            print(
                f"| {c} | {tokens / result.wall_s:.0f} | {chunks} | {1e3 * cpu_per_chunk:.3f} | "
                f"{1e3 * result.client_cpu_s / tokens:.3f} | {result.client_cpu_s / result.wall_s:.0%} | {headroom:.1f}× "
                f"| {in_process:.0f} | {tokens / result.wall_s / in_process:.2f} |"
            )
        engine.stop()


if __name__ == "__main__":
    main()
