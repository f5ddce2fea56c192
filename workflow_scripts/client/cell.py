"""Run one benchmark cell (setting × workload × concurrency × repeat) with exactly `c` requests in flight.

`c` workers share one request counter: a worker sends its next request the moment its previous one ends, so
the server always sees `c` open streams until the queue drains. The first `warmup` requests (by index) are
marked as warm-up; the analysis leaves them out.

A time-boxed cell (`seconds`) sends its `measured` requests as the minimum, then keeps sending until its server
has run `seconds` (`clock`: the server's running clock in a sliced cell, else the time since the cell began): a
slow cell (high concurrency, long answers) then costs a fixed time instead of a fixed count, and a fast one
measures more.

With `metrics`, the server's /metrics is scraped before and after the cell, and also at the edges of its steady
window (analysis/metrics.py): when the first measured request is sent, and when the first worker finds no
request left, which is the cell's (N - C + 1)-th end. The window's deltas are what the server did while it held
exactly C requests, the same stretch the aggregate tok/s counts, so the cost model's prefill share and step
cost explain that figure rather than a cell whose ramp and drain differ between settings.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import uvloop

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
    # request i carries sampling_seed = seed_base + i: every setting of a round samples from the same random streams
    # (common random numbers), so a T>0 comparison within a round is not also a comparison of luck (seed_base)
    seed_base: int | None = None
    seconds: float | None = None  # time-boxed: keep sending past `measured` until the clock reads this
    clock: Callable[[], float] | None = field(default=None, compare=False)  # None: seconds since the cell began

    @property
    def total(self) -> int:
        """The requests the cell sends at least (exactly, unless time-boxed)."""
        return self.warmup + self.measured


@dataclass
class CellResult:
    records: list[RequestRecord]
    warmup_ids: set[str]
    wall_s: float
    client_cpu_s: float  # the client's own CPU time over the cell: its overhead
    server_metrics: dict[str, float] | None = None  # the server's own per-cell deltas (client/server_metrics.py)
    window_metrics: dict[str, float] | None = None  # the same over the cell's steady window (module docstring)


SEEDS_PER_ROUND = 1 << 20  # request seeds a round may use; a cell sends far fewer requests


def seed_base(workload: dict, round_: int) -> int | None:
    """A round's first request seed (CellPlan.seed_base), from the workload's seed; None when it opts out.

    Each round draws new streams. With one set for every round, a speculative setting at T>0 wrote the same answers
    in every round, and other answers than the baseline's (its drafts use the randomness otherwise), so each
    setting was measured on one fixed draw of answer lengths that its rounds could not vary and its CI could not
    see. New streams each round put that draw inside the rounds' spread (docs/method.md)."""
    if not workload["sampling_seeds"]:
        return None
    return (workload["seed"] << 32) + round_ * SEEDS_PER_ROUND


def sampling_params(workload: dict) -> dict:
    return {
        "temperature": workload["temperature"],
        "top_p": workload["top_p"],
        "top_k": workload["top_k"],
        "max_new_tokens": workload["output_len"],
        "ignore_eos": workload["ignore_eos"],
    }


# a liveness check that runs beside a cell and raises when the server is gone or hung (liveness.watch)
Watchdog = Callable[[aiohttp.ClientSession], Awaitable[None]]


async def run_cell_async(base_url: str, plan: CellPlan, prompts: list[Prompt], params: dict, tag: str,
                         watchdog: Watchdog | None = None) -> CellResult:
    counter = itertools.count()
    records: list[RequestRecord] = []
    edges: dict[str, asyncio.Task] = {}  # the steady window's scrapes, "open" and "close"
    timeout = aiohttp.ClientTimeout(total=plan.request_timeout_s)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    times: list[float] = []

    def time_left() -> bool:
        if plan.seconds is None:
            return False
        return (plan.clock() if plan.clock else time.perf_counter() - wall0) < plan.seconds

    async def worker(session: aiohttp.ClientSession, probes: aiohttp.ClientSession) -> None:
        while (i := next(counter)) < plan.total or time_left():
            if i == plan.warmup and plan.metrics:
                edges["open"] = asyncio.ensure_future(scrape(probes, base_url, plan.api_key))
            prompt = prompts[i % len(prompts)]
            own = params if plan.seed_base is None else {**params, "sampling_seed": plan.seed_base + i}
            records.append(
                await send(
                    session, base_url, plan.api, prompt, own, f"{tag}-{i}", plan.model, plan.incremental, plan.api_key
                )
            )
        if plan.metrics and "close" not in edges:
            edges["close"] = asyncio.ensure_future(scrape(probes, base_url, plan.api_key))

    async def body(session: aiohttp.ClientSession, probes: aiohttp.ClientSession):
        """The metrics scrape before, the requests (and the window's scrapes), the scrape after: all of it under
        the watchdog. Returns the cell's and the window's deltas, or None without metrics."""
        before = await scrape(probes, base_url, plan.api_key) if plan.metrics else None
        await asyncio.gather(*(worker(session, probes) for _ in range(plan.concurrency)))
        times.extend((time.perf_counter() - wall0, time.process_time() - cpu0))
        if not plan.metrics:
            return None
        after = await scrape(probes, base_url, plan.api_key)
        return cell_deltas(before, after), cell_deltas(await edges["open"], await edges["close"])

    # the cell's session holds exactly C connections; the scrapes have their own, so none waits for a stream to end
    streams = aiohttp.TCPConnector(limit=plan.concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=streams) as session, \
            aiohttp.ClientSession(timeout=timeout) as probes:
        work = asyncio.ensure_future(body(session, probes))
        watch = asyncio.ensure_future(watchdog(session)) if watchdog else None
        try:
            done, _ = await asyncio.wait({work, watch} - {None}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                watch.result()  # raises: the server died or hung; the cell's requests are cancelled below
            deltas = await work
        finally:
            tasks = [task for task in (work, watch, *edges.values()) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # retrieved: no "never retrieved" noise
    warmup_ids = {f"{tag}-{i}" for i in range(plan.warmup)}
    cell, window = deltas if deltas else (None, None)
    return CellResult(records, warmup_ids, times[0], times[1], cell, window)


def run_cell(base_url: str, plan: CellPlan, prompts: list[Prompt], params: dict, tag: str,
             watchdog: Watchdog | None = None) -> CellResult:
    return uvloop.run(run_cell_async(base_url, plan, prompts, params, tag, watchdog))
