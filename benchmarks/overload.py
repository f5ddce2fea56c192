"""Load past capacity against a real embedded server: what a client sees when it sends more concurrent streams
than the server has slots (--max-running-requests), and how fast a storm of vanishing clients frees the slots.

For each multiple m of the slot count it runs one cell of the study's own client at concurrency m x slots and
prints sent / completed / errored (goal: completed + errored = sent, errored = 0), TTFT p50 and p99 (above 1x,
TTFT includes the time a request waits in the queue for a slot), aggregate tok/s and the most requests seen
waiting. Then the storm: 4 x slots streams open, every client drops its connection as soon as the first stream
produces tokens, and the table gives the seconds until /server_info shows nothing running or waiting.

    python -m benchmarks.overload --model /work/main/results/embedded-cpu/models/target [--slots 8]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np
import requests

from workflow_scripts.client.cell import CellPlan, run_cell
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

DEFAULT_MODEL = Path("/work/main/results/embedded-cpu/models/target")


def engine_stats(url: str) -> dict:
    return requests.get(f"{url}/server_info", timeout=30).json()["internal_states"][0]


class MaxWaiting:
    """The most requests /server_info showed waiting while a load ran (polled every 50 ms)."""

    def __init__(self, url: str):
        self.url, self.value = url, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self.value = max(self.value, engine_stats(self.url)["num_waiting"])

    def __enter__(self) -> MaxWaiting:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


async def _storm(url: str, streams: int, body: dict) -> None:
    """Open `streams` streaming requests; once the first yields a chunk, drop every connection at once."""
    first = asyncio.Event()

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(f"{url}/generate", json=body) as resp:
            async for _ in resp.content:
                first.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(streams)]
        await asyncio.wait_for(first.wait(), 300)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def storm_seconds_to_idle(url: str, streams: int, output_len: int) -> tuple[float, dict]:
    body = {"input_ids": [5, 6, 7, 8], "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}}
    asyncio.run(_storm(url, streams, body))
    dropped = time.perf_counter()
    while True:
        stats = engine_stats(url)
        if stats["num_running"] == 0 and stats["num_waiting"] == 0:
            return time.perf_counter() - dropped, stats
        if time.perf_counter() - dropped > 60:
            raise SystemExit(f"storm: slots still busy 60 s after every client left: {stats}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="target model dir")
    parser.add_argument("--slots", type=int, default=8, help="--max-running-requests of the server")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 4], help="concurrency as multiples of slots")
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--log", type=Path, default=Path("/tmp/overload_server.log"))
    args = parser.parse_args()

    prompts = synthetic_prompts(load_tokenizer(args.model), 64, args.input_len, seed=0)
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.output_len, "ignore_eos": True}
    spec = ServerSpec("embedded", str(args.model), None, "127.0.0.1", args.slots, 0, num_threads=1)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"model {args.model}, {args.slots} slots, {args.input_len} in / {args.output_len} out tokens, T=0")
    print("| concurrency | sent | completed | errored | TTFT p50 s | TTFT p99 s | e2e p99 s | agg tok/s | max waiting |")
    print("|---|---|---|---|---|---|---|---|---|")
    with ServerProcess(build_command(spec, {}, port), args.log, url, 300):
        for m in args.multiples:
            c = m * args.slots
            plan = CellPlan(concurrency=c, warmup=0, measured=args.requests_per_stream * c)
            with MaxWaiting(url) as waiting:
                result = run_cell(url, plan, prompts, params, f"x{m}")
            ok = [r for r in result.records if r.error is None]
            ttft = np.array([r.first_token_ts - r.send_ts for r in ok])
            e2e = np.array([r.end_ts - r.send_ts for r in ok])
            tokens = sum(r.output_tokens or 0 for r in ok)
            print(f"| {c} ({m}x) | {plan.total} | {len(ok)} | {len(result.records) - len(ok)} "
                  f"| {np.percentile(ttft, 50):.3f} | {np.percentile(ttft, 99):.3f} | {np.percentile(e2e, 99):.3f} "
                  f"| {tokens / result.wall_s:.0f} | {waiting.value} |")
            if len(result.records) != plan.total:
                raise SystemExit(f"concurrency {c}: sent {plan.total} requests, {len(result.records)} came back")
        streams = 4 * args.slots
        seconds, stats = storm_seconds_to_idle(url, streams, output_len=1000)
        print(f"\nstorm: {streams} streams dropped at once; idle (running {stats['num_running']}, waiting "
              f"{stats['num_waiting']}) {seconds:.2f} s later")


if __name__ == "__main__":
    main()
