"""The ways a cohort's rounds are run (benchmark.schedule), and which one `auto` picks.

- sliced: every member's server at once, a cell's round on all of them together, each server running in turns
  (client/slicing.py; the embedded engine only);
- interleaved: every member's server at once, a cell's round measured member after member;
- blocked: one member's server at a time, its cells of a round, the members in a balanced order;
- sequential: one member's server at a time, all of its rounds.
The two designs that hold every server start them again after the first round in the reverse order
(`benchmark.counterbalance_launches`), or every round (`benchmark.restart_each_round`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

from tqdm import tqdm

from workflow_scripts.client.rounds import Ledger, Planner, block_order, launch_index, launch_order, seeded_order
from workflow_scripts.client.servers import Live, Models, gpu_slices, member_gpus

log = logging.getLogger("benchmark")

# a server's resident memory beyond its weights (torch, tokenizer, HTTP stack, KV cache of the smoke shapes)
SERVER_OVERHEAD_MB = 900


def resolve_schedule(plan: dict, models: Models) -> str:
    """`auto`: every member's server at once when they fit (memory on the embedded engine, GPUs on SGLang): sliced
    on the embedded engine, interleaved on SGLang; else blocked."""
    schedule, members = plan["schedule"], list(plan["members"])
    if schedule == "sliced" and plan["engine"] != "embedded":
        raise SystemExit("benchmark.schedule: sliced freezes servers in turns, which only the embedded engine allows;"
                         " use interleaved, blocked or auto on SGLang")
    if schedule != "auto":
        return schedule
    if plan["engine"] == "sglang":
        need = sum(member_gpus(plan, name) for name in members)
        return "interleaved" if plan["node_gpus"] and need <= plan["node_gpus"] else "blocked"
    weights_mb = sum((d / "model.safetensors").stat().st_size for d in (models.target, models.draft) if d) / 2**20
    need_mb = len(members) * (SERVER_OVERHEAD_MB + 2 * weights_mb)
    available_mb = available_memory_mb()
    log.info("auto schedule: %d servers need ~%.0f MB, %.0f MB available", len(members), need_mb, available_mb)
    return "sliced" if need_mb <= 0.8 * available_mb else "blocked"


def available_memory_mb() -> float:
    with open("/proc/meminfo") as fh:
        info = dict(line.split(":", 1) for line in fh)
    return int(info["MemAvailable"].split()[0]) / 1024


class Measuring(Protocol):
    """What a design drives: the cohort job (run_cohort.Cohort), its ledger, planner and measurements."""

    plan: dict
    id: str
    seed: int
    schedule: str
    cells: dict[str, dict]
    ledger: Ledger
    planner: Planner
    launches: dict[int, list[str]]
    progress: tqdm | None

    def warm_server(self, name: str, gpus: str | None = None) -> AbstractContextManager[Live]: ...

    def measure(self, live: Live, cell: str, member: str, round_: int) -> None: ...

    def measure_sliced(self, lives: dict[str, Live], cell: str, round_: int) -> None: ...


def pending(cohort: Measuring) -> bool:
    """Whether a round still needs a cell measured: a rerun with every cell cached starts no server."""
    for round_ in range(cohort.planner.policy.max_repeats):
        active = cohort.planner.active(round_, list(cohort.cells))
        if not active:
            return False
        if round_pending(cohort, round_, active):
            return True
    return False


def round_pending(cohort: Measuring, round_: int, active: list[str]) -> bool:
    return any(not cohort.ledger.done(c, m, round_) for c in active for m in cohort.ledger.due(c, round_))


def round_cells(cohort: Measuring, round_: int) -> list[str]:
    """The cells that get this round (the precision rule), the progress bar stretched to their measurements."""
    active = cohort.planner.active(round_, list(cohort.cells))
    todo = sum(not cohort.ledger.done(c, m, round_) for c in active for m in cohort.ledger.due(c, round_))
    if cohort.progress is not None and todo:
        cohort.progress.total = max(cohort.progress.total or 0, cohort.progress.n + todo)
        cohort.progress.refresh()
    return active


def run_interleaved(cohort: Measuring) -> None:
    """Every member's server at once (sliced too: its cells' rounds run on all of them together)."""
    if not pending(cohort):
        return
    plan = cohort.plan
    gpus = gpu_slices(plan, list(plan["members"])) if plan["engine"] == "sglang" else {}
    with ExitStack() as held:
        servers: dict[str, Live] = {}
        launched = planned = -1  # the launch whose servers are up; the launch the plan's rounds have reached
        for round_ in range(cohort.planner.policy.max_repeats):
            active = round_cells(cohort, round_)
            if not active:
                break
            launch = launch_index(round_, plan["restart_each_round"], plan["counterbalance_launches"])
            names = launch_order(list(plan["members"]), cohort.seed, cohort.id, launch)
            if launch != planned:
                # where the plan starts this launch: rounds cached by an earlier run of the job keep the positions
                # they were measured at, for the start-position fit (the order follows from the seed)
                cohort.launches[round_] = names
                planned = launch
            if not round_pending(cohort, round_, active):
                continue  # every cell of the round cached: no server needed for it
            if launch != launched:
                # fresh servers in the reverse order: a member's start position (memory placement, its warm-up)
                # then averages out over a pair of launches instead of biasing every round alike
                held.close()
                cohort.launches[round_] = names
                servers = {name: held.enter_context(cohort.warm_server(name, gpus.get(name))) for name in names}
                launched = launch
            for cell in cohort.planner.cell_order(round_, active, cohort.id):
                if cohort.planner.over_budget(round_):
                    return
                todo = [m for m in seeded_order(cohort.ledger.due(cell, round_), "turns", cohort.seed, cohort.id, cell,
                                                round_)
                        if not cohort.ledger.done(cell, m, round_)]
                if cohort.schedule == "sliced" and todo:
                    cohort.measure_sliced({m: servers[m] for m in todo}, cell, round_)
                    continue
                for member in todo:
                    cohort.measure(servers[member], cell, member, round_)


def run_blocked(cohort: Measuring) -> None:
    """One member's server at a time, a round at a time."""
    names = sorted(cohort.plan["members"])
    for round_ in range(cohort.planner.policy.max_repeats):
        active = round_cells(cohort, round_)
        if not active or cohort.planner.over_budget(round_):
            return
        for member in block_order(names, round_):
            todo = [c for c in seeded_order(active, cohort.id, round_)
                    if member in cohort.ledger.due(c, round_) and not cohort.ledger.done(c, member, round_)]
            if todo:
                with cohort.warm_server(member) as live:
                    for cell in todo:
                        cohort.measure(live, cell, member, round_)


def run_sequential(cohort: Measuring) -> None:
    """One member's server at a time, all of its rounds."""
    for member in sorted(cohort.plan["members"]):
        todo = [(c, r) for r in range(cohort.planner.policy.repeats) for c in sorted(cohort.cells)
                if member in cohort.ledger.members_of[c] and not cohort.ledger.done(c, member, r)]
        if todo:
            cohort.progress.total += len(todo)
            with cohort.warm_server(member) as live:
                for cell, round_ in todo:
                    cohort.measure(live, cell, member, round_)


DESIGNS: dict[str, Callable[[Measuring], None]] = {"sliced": run_interleaved, "interleaved": run_interleaved,
                                                   "blocked": run_blocked, "sequential": run_sequential}
