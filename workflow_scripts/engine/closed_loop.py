"""A closed loop that drives a Scheduler directly, with no server in between: the in-process side of every
comparison with the HTTP path (benchmarks/engine_bench.py, benchmarks/client_overhead.py) and the engine process's
in-engine bench (`--enable-in-engine-bench`), so both drive the engine the same way."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workflow_scripts.engine.types import SamplingParams, TokenEvent

if TYPE_CHECKING:  # torch loads with the scheduler; the engine process imports this before it binds its cores
    from workflow_scripts.engine.scheduler import Scheduler


@dataclass
class Timed:
    """One request's token timestamps (one per token) and final event."""

    submit: float
    times: list[float]
    tokens: int = 0
    final: TokenEvent | None = None
    output_ids: list[int] = field(default_factory=list)

    @property
    def step_gaps(self) -> list[float]:
        """Seconds between consecutive token events (one event per engine step, 1..k+1 tokens each)."""
        events = sorted(set(self.times))
        return [b - a for a, b in zip(events, events[1:])]

    @property
    def decode_tok_s(self) -> float:
        span = self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0
        return (self.tokens - 1) / span if span > 0 else float("nan")


def run_cell(engine: Scheduler, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
             concurrency: int, timeout: float = 600.0) -> list[Timed]:
    """Closed loop: keep `concurrency` requests in flight until every prompt is done (bounded wait: past
    `timeout` seconds the requests still held are aborted and TimeoutError is raised).

    `params` is one for all prompts, or one per prompt.
    """
    done = threading.Semaphore(0)
    results: list[Timed] = []
    pending = list(zip(prompts, params if isinstance(params, list) else [params] * len(prompts)))
    lock = threading.Lock()
    rids: list[str] = []

    def submit_next() -> None:
        with lock:
            if not pending:
                return
            prompt, prompt_params = pending.pop(0)
            rec = Timed(time.perf_counter(), [])
            results.append(rec)
            rids.append(f"bench-{time.monotonic_ns()}-{len(results)}")
            rid = rids[-1]
        engine.submit(rid, prompt, prompt_params, sink_for(rec))

    def sink_for(rec: Timed):
        def sink(ev: TokenEvent) -> None:
            now = time.perf_counter()
            if ev.new_ids:
                rec.times.extend([now] * len(ev.new_ids))
                rec.tokens += len(ev.new_ids)
                rec.output_ids.extend(ev.new_ids)
            if ev.finished:
                rec.final = ev
                submit_next()
                done.release()

        return sink

    for _ in range(min(concurrency, len(prompts))):
        submit_next()
    deadline = time.monotonic() + timeout
    for _ in prompts:
        if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            with lock:
                pending.clear()
            for rid in rids:  # finished ones are ignored
                engine.abort(rid, "the closed-loop cell timed out")
            raise TimeoutError(f"the closed-loop cell did not finish within {timeout:g} s")
    return results
