"""Run one benchmark cell (setting × workload × concurrency × repeat) with exactly `c` requests in flight.

`c` workers share one request counter: a worker sends its next request the moment its previous one ends, so
the server always sees `c` open streams until the queue drains. The first `warmup` requests (by index) are
marked as warm-up; the analysis leaves them out.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from workflow_scripts.client.prompts import Prompt
from workflow_scripts.client.server_metrics import cell_deltas, scrape
from workflow_scripts.client.streaming import RequestRecord, send


@dataclass(frozen=True)
class CellPlan:
    concurrency: int
    warmup: int
    measured: int
    api: str = "generate"
    request_timeout_s: float = 300.0
    model: str = "default"
    incremental: bool = False  # the server streams deltas (--incremental-streaming-output)
    api_key: str | None = None  # the server's --api-key, if it has one
    metrics: bool = False  # scrape the server's /metrics before and after the cell (--enable-metrics)
    # request i carries sampling_seed = seed_base + i: every setting and every round of the cell then samples from
    # the same random streams (common random numbers), so a T>0 comparison is not also a comparison of luck
    seed_base: int | None = None

    @property
    def total(self) -> int:
        return self.warmup + self.measured


@dataclass
class CellResult:
    records: list[RequestRecord]
    warmup_ids: set[str]
    wall_s: float
    client_cpu_s: float  # the client's own CPU time over the cell: its overhead
    server_metrics: dict[str, float] | None = None  # the server's own per-cell deltas (client/server_metrics.py)


def seed_base(workload: dict) -> int | None:
    """The cell's first request seed (CellPlan.seed_base), from the workload's seed; None when it opts out."""
    return workload["seed"] << 32 if workload["sampling_seeds"] else None


def sampling_params(workload: dict) -> dict:
    return {
        "temperature": workload["temperature"],
        "top_p": workload["top_p"],
        "top_k": workload["top_k"],
        "max_new_tokens": workload["output_len"],
        "ignore_eos": workload["ignore_eos"],
    }


# a liveness check that runs beside a cell and raises when the server is gone or hung (run_cohort.watch)
Watchdog = Callable[[aiohttp.ClientSession], Awaitable[None]]


async def run_cell_async(base_url: str, plan: CellPlan, prompts: list[Prompt], params: dict, tag: str,
                         watchdog: Watchdog | None = None) -> CellResult:
    counter = itertools.count()
    records: list[RequestRecord] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while (i := next(counter)) < plan.total:
            prompt = prompts[i % len(prompts)]
            own = params if plan.seed_base is None else {**params, "sampling_seed": plan.seed_base + i}
            records.append(
                await send(
                    session, base_url, plan.api, prompt, own, f"{tag}-{i}", plan.model, plan.incremental, plan.api_key
                )
            )

    timeout = aiohttp.ClientTimeout(total=plan.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=plan.concurrency)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    times: list[float] = []

    async def body(session: aiohttp.ClientSession) -> dict[str, float] | None:
        """The metrics scrape before, the requests, the scrape after: all of it under the watchdog."""
        before = await scrape(session, base_url, plan.api_key) if plan.metrics else None
        await asyncio.gather(*(worker(session) for _ in range(plan.concurrency)))
        times.extend((time.perf_counter() - wall0, time.process_time() - cpu0))
        return cell_deltas(before, await scrape(session, base_url, plan.api_key)) if plan.metrics else None

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        work = asyncio.ensure_future(body(session))
        watch = asyncio.ensure_future(watchdog(session)) if watchdog else None
        try:
            done, _ = await asyncio.wait({work, watch} - {None}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                watch.result()  # raises: the server died or hung; the cell's requests are cancelled below
            deltas = await work
        finally:
            tasks = [task for task in (work, watch) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # retrieved: no "never retrieved" noise
    warmup_ids = {f"{tag}-{i}" for i in range(plan.warmup)}
    return CellResult(records, warmup_ids, times[0], times[1], deltas)


def run_cell(base_url: str, plan: CellPlan, prompts: list[Prompt], params: dict, tag: str,
             watchdog: Watchdog | None = None) -> CellResult:
    return asyncio.run(run_cell_async(base_url, plan, prompts, params, tag, watchdog))
