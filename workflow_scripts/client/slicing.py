"""Time-sliced cells: every member of a round measures the same cell at once, its server running only in its turn.

A shared host moves the engine's speed within seconds (memory bandwidth taken by other tenants), about as long as
a cell lasts, so two cells measured one after another see different machines and no pairing of rounds can undo
that. Here the members' cells run together, and a conductor lets one server's process group run at a time, for
`slice_s` each, round robin (SIGCONT, then SIGSTOP: the others are frozen, as `kill -STOP` freezes them, and use no
CPU). Each member then sees the same phases of the machine within one turn of the conductor, and its client
timestamps are mapped to its server's own *running clock* (the time its server was allowed to run), on which every
metric of the analysis is computed as before: the time a server spent frozen counts for nothing.

The embedded engine only: an SGLang server on its own GPUs shares nothing that would drift apart, and a frozen
CUDA process is not something to rely on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TypeVar

import numpy as np
import pandas as pd
import uvloop

Interval = tuple[float, float]  # (continued, stopped), time.perf_counter() seconds
T = TypeVar("T")


class Conductor:
    """Round-robin turns over the members' process groups, on a thread of its own, for one sliced cell.

    On entry every group is frozen; `done(member)` takes a member out of the turns; on exit every group runs
    again, whatever happened (a frozen server would fail the next liveness check and ignore SIGTERM)."""

    def __init__(self, groups: dict[str, int], slice_s: float, order: Iterable[str]) -> None:
        self.groups, self.slice_s, self.order = groups, slice_s, list(order)
        self.intervals: dict[str, list[Interval]] = {name: [] for name in groups}
        self._turn_began: dict[str, float] = {}  # the member whose turn it is: since when
        self.finished: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a member finished or the cell ended: its turn need not run out
        self._thread = threading.Thread(target=self._turns, name="conductor", daemon=True)

    def __enter__(self) -> Conductor:
        try:
            for group in self.groups.values():
                os.killpg(group, signal.SIGSTOP)
        except ProcessLookupError:  # a server already gone: continue the ones frozen so far, the job reports it
            self._continue_all()
            raise
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._continue_all()

    def _continue_all(self) -> None:
        for group in self.groups.values():
            try:
                os.killpg(group, signal.SIGCONT)
            except ProcessLookupError:  # a server that died: the job reports it
                pass

    def ran_s(self, member: str) -> float:
        """Seconds the member's server has run in this cell so far: its finished turns and the one under way."""
        began = self._turn_began.get(member)
        return sum(b - a for a, b in self.intervals[member]) + (time.perf_counter() - began if began else 0.0)

    def done(self, member: str) -> None:
        self.finished.add(member)
        self._wake.set()

    def _turns(self) -> None:
        while not self._stop.is_set():
            running = [name for name in self.order if name not in self.finished]
            if not running:
                self._stop.wait()
                return
            for name in running:
                if self._stop.is_set():
                    return
                group = self.groups[name]
                start = time.perf_counter()
                self._turn_began[name] = start
                try:
                    os.killpg(group, signal.SIGCONT)
                    # wakes early when the member's cell ends, so the next one is not kept waiting
                    self._wait_turn(name)
                    os.killpg(group, signal.SIGSTOP)
                except ProcessLookupError:  # the server died in its turn: the cell's liveness check reports it
                    self.finished.add(name)
                self.intervals[name].append((start, time.perf_counter()))
                del self._turn_began[name]

    def _wait_turn(self, name: str) -> None:
        end = time.perf_counter() + self.slice_s
        while (left := end - time.perf_counter()) > 0 and name not in self.finished and not self._stop.is_set():
            self._wake.wait(left)
            self._wake.clear()


class TurnClock:
    """A member's running clock in the sliced cell under way (0 before it starts): what time-boxes its cell."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.conductor: Conductor | None = None

    def __call__(self) -> float:
        return self.conductor.ran_s(self.member) if self.conductor else 0.0


def run_together(groups: dict[str, int], slice_s: float, order: list[str],
                 sends: dict[str, Callable[[], Awaitable[T]]],
                 clocks: Iterable[TurnClock] = ()) -> tuple[dict[str, T], dict[str, list[Interval]]]:
    """Run every member's cell at once, its server's group only in its turns: each member's result and its turns.
    A member whose cell ends (or fails) leaves the turns at once, so the others are not kept waiting for it.
    `clocks` are bound to this cell's turns (a time-boxed cell reads its server's running clock from one)."""
    with Conductor(groups, slice_s, order) as conductor:
        for clock in clocks:
            clock.conductor = conductor
        async def one(member: str) -> tuple[str, T]:
            try:
                return member, await sends[member]()
            finally:
                conductor.done(member)

        async def together() -> dict[str, T]:
            return dict(await asyncio.gather(*(one(member) for member in order)))

        results = uvloop.run(together())
    return results, conductor.intervals


def running_clock(intervals: list[Interval]):
    """The map from the benchmark's clock to a server's running clock over its turns: t minus the time the server
    was frozen before t, anchored at its first turn's start (so the values stay perf_counter-like seconds)."""
    if not intervals:
        raise ValueError("a sliced cell's server never ran: no turns recorded")
    starts = np.array([a for a, _ in intervals])
    lengths = np.array([b - a for a, b in intervals])
    ran_before = np.concatenate([[0.0], np.cumsum(lengths)])

    def to_running(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype="float64")
        k = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, None)  # the last turn started by t
        inside = np.clip(t - starts[k], 0.0, lengths[k])
        return starts[0] + ran_before[k] + inside

    return to_running


def to_running_clock(frame: pd.DataFrame, intervals: list[Interval]) -> pd.DataFrame:
    """A cell's records with every timestamp on its server's running clock, and the latencies recomputed."""
    clock = running_clock(intervals)
    out = frame.copy()
    for column in ("send_ts", "first_token_ts", "end_ts"):
        values = out[column].to_numpy(dtype="float64")
        out[column] = np.where(np.isnan(values), np.nan, clock(np.nan_to_num(values)))
    out["chunk_ts"] = [None if ts is None else clock(ts).tolist() for ts in out["chunk_ts"]]
    out["ttft_s"] = out["first_token_ts"] - out["send_ts"]
    out["e2e_s"] = (out["end_ts"] - out["send_ts"]).where(out["error"].isna())
    return out


def run_share(intervals: list[Interval], start: float, end: float) -> float:
    """The share of [start, end] in which the server ran: about 1 / members for a round-robin cell."""
    ran = sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
    return ran / (end - start) if end > start else float("nan")
