"""What the HTTP server costs the embedded engine: served ÷ in-process decode speed of the baseline at concurrency 1.

    python -m workflow_scripts.profiling.served_overhead --target results/S/models/target --threads 1 \
        --max-running-requests 64 --out results/S/profile/served_overhead.json

The study measures every setting through the server. If the server's processes cost the engine much of its speed
(the served engine once ran at 0.28-0.6 of in-process on 2-core hosts, docs/embedded_engine_served.md), the study's
verdicts are about the server more than about speculation. So this runs, once at the start of a study, the baseline
on the same pair in-process (engine/closed_loop.py, the benchmarks' loop) and behind a server started as the study
starts it (launcher.command.build_command, driven by the study's client), alternating the two request by request,
and writes the median of the per-round ratios of decode tok/s ((tokens − 1) ÷ (last token − first token) of one
T=0, ignore_eos request), with the engine process's torch setup. The summary prints the ratio and warns below
WARN_BELOW. benchmarks/engine_bench.py uses the same server and cell helpers for its served rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import requests

from workflow_scripts.io import atomic_write_text
from workflow_scripts.client.cell import CellPlan, run_cell as run_http_cell
from workflow_scripts.client.prompts import Prompt
from workflow_scripts.engine.closed_loop import Timed, run_cell
from workflow_scripts.engine.types import SamplingParams, SpecConfig, TokenEvent
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

WARN_BELOW = 0.8  # below this the server, not speculation, dominates what the study measures
STARTUP_TIMEOUT_S = 300
PROMPT_LEN = 32

log = logging.getLogger(__name__)


def server_setting(spec: SpecConfig | None) -> dict:
    """The study's setting (SGLang's flags, underscored) of one engine setting."""
    if spec is None:
        return {}
    return {"speculative_algorithm": spec.algorithm, "speculative_num_steps": spec.num_steps,
            "speculative_eagle_topk": spec.eagle_topk, "speculative_num_draft_tokens": spec.num_draft_tokens}


def start_server(target: Path, draft: Path | None, spec: SpecConfig | None, max_running_requests: int,
                 threads: int | None, log_dir: Path, extra_args: list[str] = ()) -> ServerProcess:
    """One setting's embedded server on loopback, started as the study starts it (same launcher, flags, streaming)."""
    port = free_port()
    server = ServerSpec("embedded", str(target), str(draft) if draft else None, "127.0.0.1", max_running_requests, 0,
                        num_threads=threads, incremental_streaming=True)
    argv = build_command(server, {**server_setting(spec), "extra_args": list(extra_args)}, port)
    proc = ServerProcess(argv, log_dir / f"server_{port}.log", f"http://127.0.0.1:{port}", STARTUP_TIMEOUT_S)
    proc.start()
    return proc


def http_params(params: SamplingParams) -> dict:
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "max_new_tokens": params.max_new_tokens, "ignore_eos": params.ignore_eos}


def served_cell(url: str, prompts: list[list[int]], params: SamplingParams, concurrency: int) -> list[Timed]:
    """A closed-loop cell through HTTP with the study's client, as the in-process loop's Timed records: each
    streamed chunk's tokens at the chunk's arrival, as the in-process sink stamps one engine step's tokens."""
    plan = CellPlan(concurrency=concurrency, warmup=0, measured=len(prompts), incremental=True)
    result = run_http_cell(url, plan, [Prompt(i, input_ids=p) for i, p in enumerate(prompts)], http_params(params),
                           "served")
    cell = []
    for r in result.records:
        if r.error is not None:
            raise RuntimeError(f"served request {r.request_id} failed: {r.error}")
        times = [t for t, n in zip(r.chunk_ts, r.chunk_tokens) for _ in range(n)]
        final = TokenEvent(r.request_id, [], True, None, r.output_tokens, r.spec_verify_ct or 0, 0, 0)
        cell.append(Timed(r.send_ts, times, len(times), final, r.output_ids))
    return cell


def measure(target: Path, threads: int | None, max_running_requests: int, new_tokens: int, rounds: int,
            log_dir: Path) -> dict:
    """Alternate one in-process and one served request `rounds` times (after one of each to warm up)."""
    import torch

    from workflow_scripts.engine.scheduler import Scheduler

    engine = Scheduler(target, None, max_running_requests, 0, num_threads=threads)
    engine.start()
    server = None
    try:
        server = start_server(target, None, None, max_running_requests, threads, log_dir)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(2, engine.vocab_size, (PROMPT_LEN,), generator=g).tolist()
        params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
        run_cell(engine, [prompt], params, 1)
        served_cell(server.base_url, [prompt], params, 1)
        in_process, served = [], []
        for _ in range(rounds):
            in_process.append(run_cell(engine, [prompt], params, 1)[0].decode_tok_s)
            served.append(served_cell(server.base_url, [prompt], params, 1)[0].decode_tok_s)
        info = requests.get(server.base_url + "/get_server_info", timeout=30).json()
    finally:
        engine.stop()
        if server is not None:
            server.stop()
    return {
        "concurrency": 1,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "in_process_tok_s": statistics.median(in_process),
        "served_tok_s": statistics.median(served),
        "ratio": statistics.median(s / i for s, i in zip(served, in_process)),
        "warn_below": WARN_BELOW,
        "in_process_torch": engine.torch_config,
        "engine_torch": info.get("engine_torch"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="the study's target model dir")
    ap.add_argument("--threads", type=int, default=None, help="torch threads, as the study's servers run (--num-threads)")
    ap.add_argument("--max-running-requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write (atomically)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.rounds < 1 or args.new_tokens < 2:
        ap.error("--rounds must be >= 1 and --new-tokens >= 2")
    with tempfile.TemporaryDirectory(prefix="served_overhead_") as log_dir:
        result = measure(args.target, args.threads, args.max_running_requests, args.new_tokens, args.rounds,
                         Path(log_dir))
    log.info("served ÷ in-process at C=1: %.2f (%.0f ÷ %.0f tok/s)", result["ratio"], result["served_tok_s"],
             result["in_process_tok_s"])
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
