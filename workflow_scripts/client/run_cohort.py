"""The benchmark job of one cohort: measure its members in rounds, write benchmark/{cohort}.parquet and .json.

    python -m workflow_scripts.client.run_cohort --plan JSON --target DIR [--draft DIR] [--moe-installed FILE] \
        --cells-dir results/S/cells/COHORT --server-log-dir DIR --out results/S/benchmark/COHORT.parquet \
        --meta-out results/S/benchmark/COHORT.json

The plan comes from workflow_scripts.client.cohorts (which settings are measured together, over which cells);
the stopping rule from workflow_scripts.client.rounds; the design (sliced, interleaved, blocked, sequential) from
workflow_scripts.client.designs; the liveness checks from workflow_scripts.client.liveness. Each measured cell is
cached (workflow_scripts.client.cache) under `cells/{cohort}/{runtime key}/` (the key holds the models' and the MoE
file's digests and the design that ran), once its server proved alive after it, so a killed job loses at most the
cell in flight (sliced: the round of the cell in flight, whose members run at once) and its rerun completes the
same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import aiohttp
import pandas as pd
import uvloop
from tqdm import tqdm

from workflow_scripts.analysis.study_config import is_adaptive, is_calibration
from workflow_scripts.io import atomic_write_text
from workflow_scripts.client.cache import CellCache, cell_metrics, runtime_key
from workflow_scripts.client.cell import CellPlan, CellResult, run_cell_async, sampling_params, seed_base
from workflow_scripts.client.cohorts import MANIFEST
from workflow_scripts.client.designs import DESIGNS, resolve_schedule
from workflow_scripts.client.liveness import check_supervisor, exit_on_sigterm, watch
from workflow_scripts.client.prompts import build_prompts
from workflow_scripts.client.records import cell_frame, write_parquet_atomic
from workflow_scripts.client.rounds import Ledger, Planner, RoundPolicy, seeded_order
from workflow_scripts.client.servers import Live, Models, member_server
from workflow_scripts.client.slicing import TurnClock, run_share, run_together, to_running_clock
from workflow_scripts.machine import memory_speed_gbs, stream_bandwidth_gbs

log = logging.getLogger("benchmark")


class Cohort:
    """One cohort job: its cells, its ledger of measured rounds and the servers that measure them."""

    def __init__(self, plan: dict, models: Models, args: argparse.Namespace) -> None:
        self.plan, self.models, self.args = plan, models, args
        self.id, self.control = plan["id"], plan["control"]
        self.cells = {cell["key"]: cell for cell in plan["cells"]}
        members_of = {key: [name for name, m in plan["members"].items() if key in m["cells"]] for key in self.cells}
        members = plan["members"].items()
        self.ledger = Ledger(self.control, members_of,
                             bystanders=frozenset(name for name, m in members if is_calibration(m["args"])),
                             challengers=frozenset(name for name, m in members if is_adaptive(m["args"])))
        self.planner = Planner(RoundPolicy.from_plan(plan["rounds"]), self.ledger)
        self.schedule = resolve_schedule(plan, models)
        self.cache = CellCache(args.cells_dir / runtime_key(plan, models, self.schedule))
        self.prompts = {name: build_prompts(cell["spec"], models.target)
                        for name, cell in {c["workload"]: c for c in plan["cells"]}.items()}
        self.seconds: dict[str, float] = {name: 0.0 for name in plan["members"]}
        self.seed = plan["seed"]
        # what the meta records of the orders: round -> servers' launch order (the ledger's: the race frees the
        # values of the start position with it); "cell/round" -> sliced turn order
        self.launches: dict[int, list[str]] = self.ledger.launches
        self.turns: dict[str, list[str]] = {}
        self.progress: tqdm | None = None

    # --- one measurement ---------------------------------------------------------------------------------------
    def measure(self, live: Live, cell: str, member: str, round_: int) -> None:
        check_supervisor(self.args.supervisor_pid)
        spec = self.cells[cell]
        tag = self.tag(spec, member, round_)
        cell_plan = replace(self.cell_plan(live, spec, spec["warmup"], spec["measured"], round_,
                                           metrics=live.spec.enable_metrics), seconds=spec.get("seconds"))
        mem_before = memory_speed_gbs()
        start_ts, t0 = time.time(), time.perf_counter()
        result = uvloop.run(self.send_measured(live, spec, cell_plan, tag))
        live.process.check_alive()
        mem_gbs = math.sqrt(mem_before * memory_speed_gbs())  # the machine's phase around the cell
        frame = self.frame(result, cell_plan, cell, member, round_, start_ts, mem_gbs)
        self.keep(frame, cell, member, round_, time.perf_counter() - t0, result)

    def measure_sliced(self, lives: dict[str, Live], cell: str, round_: int) -> None:
        """One round of a cell on every member at once, each server running only in its turn (client/slicing.py);
        each member's records are on its server's running clock. Written when all of them are done: a killed job
        measures the whole round of the cell again."""
        check_supervisor(self.args.supervisor_pid)
        spec = self.cells[cell]
        order = seeded_order(list(lives), "turns", self.seed, self.id, cell, round_)
        self.turns[f"{cell}/{round_}"] = order
        clocks = {m: TurnClock(m) for m in order}  # a time-boxed cell ends on its server's running clock
        plans = {m: replace(self.cell_plan(lives[m], spec, spec["warmup"], spec["measured"], round_,
                                           metrics=lives[m].spec.enable_metrics),
                            seconds=spec.get("seconds"), clock=clocks[m]) for m in order}
        groups = {m: lives[m].process.proc.pid for m in order}  # each server leads its own process group
        mem_before = memory_speed_gbs()
        start_ts, t0 = time.time(), time.perf_counter()
        sends = {m: functools.partial(self.send_measured, lives[m], spec, plans[m], self.tag(spec, m, round_))
                 for m in order}
        results, turns = run_together(groups, self.plan["slice_ms"] / 1000, order, sends, clocks.values())
        wall_s = time.perf_counter() - t0
        for m in order:
            lives[m].process.check_alive()
        mem_gbs = math.sqrt(mem_before * memory_speed_gbs())
        for m in order:
            frame = self.frame(results[m], plans[m], cell, m, round_, start_ts, mem_gbs)
            frame = to_running_clock(frame, turns[m])
            frame["cell_run_share"] = run_share(turns[m], t0, t0 + results[m].wall_s)
            self.keep(frame, cell, m, round_, wall_s / len(order), results[m])

    async def send_measured(self, live: Live, spec: dict, plan: CellPlan, tag: str) -> CellResult:
        """A measured cell, alone or sliced: a request error from a server that died (e.g. the /metrics scrape of
        one that just did) is reported as its death, with its log."""
        try:
            return await self.send_cell_async(live, spec, plan, tag)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            live.process.raise_if_dead("died during a cell")
            raise

    @staticmethod
    def tag(spec: dict, member: str, round_: int) -> str:
        return f"{member}-{spec['workload']}-c{spec['concurrency']}-r{round_}"

    def frame(self, result: CellResult, plan: CellPlan, cell: str, member: str, round_: int, start_ts: float,
              mem_gbs: float) -> pd.DataFrame:
        spec = self.cells[cell]
        if len(result.records) < plan.total or (plan.seconds is None and len(result.records) != plan.total):
            raise RuntimeError(f"cell {self.tag(spec, member, round_)}: sent {plan.total} requests"
                               f"{' at least' if plan.seconds else ''} but recorded {len(result.records)}")
        return cell_frame(result, member, spec["workload"], spec["spec"]["temperature"], spec["concurrency"], round_,
                          self.id, start_ts, mem_gbs)

    def keep(self, frame: pd.DataFrame, cell: str, member: str, round_: int, seconds: float,
             result: CellResult) -> None:
        """Cache a measured cell, enter it in the ledger, log it."""
        self.cache.write(frame, cell, member, round_)
        metrics = cell_metrics(frame)
        self.ledger.add(cell, member, round_, metrics)
        self.seconds[member] += seconds
        log.info("cell %s: %d requests, %d errors, aggregate %.1f tok/s, per-request %.1f tok/s, client CPU %.0f%% "
                 "of one core, memory %.1f GB/s%s", self.tag(self.cells[cell], member, round_), len(frame),
                 int(frame.error.notna().sum()),
                 metrics["aggregate_tok_s"], metrics["per_request_tok_s"], 100 * result.client_cpu_s / result.wall_s,
                 frame["cell_mem_gbs"].iloc[0],
                 "" if pd.isna(share := frame["cell_run_share"].iloc[0]) else f", ran {100 * share:.0f}% of the cell")
        if self.progress is not None:
            self.progress.update()

    def cell_plan(self, live: Live, spec: dict, warmup: int, measured: int, round_: int, metrics: bool) -> CellPlan:
        """How a cell of `spec` is driven against this server in a round (its streaming mode, key, seeds)."""
        return CellPlan(spec["concurrency"], warmup, measured, self.plan["api"], self.plan["request_timeout_s"],
                        incremental=live.spec.incremental_streaming, api_key=live.spec.api_key, metrics=metrics,
                        seed_base=seed_base(spec["spec"], round_))

    async def send_cell_async(self, live: Live, spec: dict, plan: CellPlan, tag: str) -> CellResult:
        """Send one cell (measured or warm-up) with the liveness check beside it."""
        return await run_cell_async(live.url, plan, self.prompts[spec["workload"]], sampling_params(spec["spec"]),
                                    tag, watchdog=functools.partial(watch, live.process, live.url))

    def warm(self, live: Live, member: str) -> None:
        """One unrecorded wave at the member's highest concurrency of each workload (benchmark.server_warmup)."""
        if not self.plan["server_warmup"]:
            return
        cells = [self.cells[c] for c in self.cells if member in self.ledger.members_of[c]]
        widest = {spec["workload"]: spec for spec in sorted(cells, key=lambda spec: spec["concurrency"])}
        t0 = time.perf_counter()
        for spec in widest.values():
            c = spec["concurrency"]
            plan = self.cell_plan(live, spec, 0, c, 0, metrics=False)
            result = uvloop.run(self.send_cell_async(live, spec, plan, f"{member}-{spec['workload']}-c{c}-warmup"))
            live.process.check_alive()
            if errors := [r.error for r in result.records if r.error]:
                raise RuntimeError(f"server warm-up of {member} ({spec['workload']}, concurrency {c}): {errors[0]}")
            if spec.get("seconds") is not None:  # timed on a second wave: the first paid the first-time costs
                tag = f"{member}-{spec['workload']}-c{c}-warmup2"
                again = uvloop.run(self.send_cell_async(live, spec, plan, tag))
                check_cell_seconds(spec, again.wall_s)
        log.info("server %s warmed up in %.1f s (%s)", member, time.perf_counter() - t0,
                 ", ".join(f"{w} c{spec['concurrency']}" for w, spec in widest.items()))

    # --- servers (the designs in client/designs.py start them) --------------------------------------------------
    def server(self, name: str, gpus: str | None = None):
        return member_server(self.plan, name, self.models, self.args.threads, self.args.server_log_dir, gpus)

    @contextmanager
    def warm_server(self, name: str, gpus: str | None = None) -> Iterator[Live]:
        """A member's server, started and warmed up (the warm-up counts in the member's time)."""
        with self.server(name, gpus) as live:
            t0 = time.perf_counter()
            self.warm(live, name)
            self.seconds[name] += time.perf_counter() - t0
            yield live

    # --- the job -----------------------------------------------------------------------------------------------
    def run(self) -> dict:
        manifest = self.args.cells_dir / MANIFEST
        if not manifest.is_file():
            atomic_write_text(manifest, json.dumps({k: self.plan[k] for k in
                                                   ("id", "control", "members", "cells", "schedule")}, indent=1))
        cached = self.cache.load(self.ledger, self.cells, self.plan["members"])
        schedule = self.schedule
        log.info("cohort %s: control %s; members %s; %d cells; %d cached cell-rounds; schedule %s (configured %s)",
                 self.id, self.control, ", ".join(self.plan["members"]), len(self.cells), cached, schedule,
                 self.plan["schedule"])
        for name, member in self.plan["members"].items():
            log.info("member %s: %d cells", name, len(member["cells"]))
        bandwidth = stream_bandwidth_gbs()
        log.info("machine: streaming memory bandwidth %.1f GB/s (one thread, sum over 256 MB)", bandwidth)
        t0 = time.perf_counter()
        with tqdm(total=0, desc=f"{self.id} cells", unit="cell") as self.progress:
            DESIGNS[schedule](self)
        measuring_s = time.perf_counter() - t0
        for name, seconds in self.seconds.items():
            log.info("time measuring %s: %.0f s", name, seconds)
        log.info("time measuring in all (servers' start-up included): %.0f s%s", measuring_s,
                 "; the time budget (benchmark.time_budget_min) ended it" if self.planner.budget_hit else "")
        return self.meta(schedule, measuring_s, bandwidth)

    def meta(self, schedule: str, measuring_s: float, bandwidth: float) -> dict:
        policy = self.planner.policy
        cells = []
        priors = self.ledger.priors()
        for key, spec in self.cells.items():
            half = self.ledger.half_width_pct(key, priors=priors)
            cells.append({"workload": spec["workload"], "concurrency": spec["concurrency"],
                          "rounds": len(self.ledger.complete_rounds(key)),
                          "half_width_pct": half if half != float("inf") else None,
                          "precision_met": half <= policy.precision_pct,
                          "eliminated": self.ledger.eliminated.get(key, {}),
                          "out_of_reach_round": self.planner.out_of_reach.get(key)})
        return {"cohort": self.id, "control": self.control, "members": list(self.plan["members"]),
                "schedule": schedule, "schedule_configured": self.plan["schedule"],
                "precision_pct": policy.precision_pct, "repeats": policy.repeats, "max_repeats": policy.max_repeats,
                "time_budget_min": self.plan["rounds"]["time_budget_min"], "budget_hit": self.planner.budget_hit,
                "allocation": policy.allocation, "equivalence_pct": policy.equivalence_pct, "seed": self.seed,
                "launch_order": {str(r): names for r, names in self.launches.items()}, "turn_order": self.turns,
                "measuring_s": measuring_s, "member_s": self.seconds, "mem_bandwidth_gbs": bandwidth,
                "cells": cells}

    def records(self) -> pd.DataFrame:
        return self.cache.records(sorted(self.ledger.values))


def memory_spread(records: pd.DataFrame) -> dict | None:
    """The machine's memory speed over the cohort's cells (5th, 50th, 95th percentile, GB/s; one value a cell):
    how much the machine itself moved while it measured. None when no cell was probed."""
    per_cell = records.groupby(["setting", "workload", "concurrency", "repeat"])["cell_mem_gbs"].first().dropna()
    if per_cell.empty:
        return None
    p5, p50, p95 = (float(per_cell.quantile(q)) for q in (0.05, 0.5, 0.95))
    return {"p5": p5, "median": p50, "p95": p95, "cells": int(len(per_cell))}


def check_cell_seconds(spec: dict, wave_s: float) -> None:
    """A time-boxed cell must have time for its minimum of measured requests: estimated from a warm-up wave (one
    request per stream at the cell's concurrency, the server running alone; the second wave, as the first pays
    the first-time costs, 4x a steady wave in one smoke run), it needs (warm-up + measured) / concurrency waves."""
    seconds = spec.get("seconds")
    if seconds is None:
        return
    c = spec["concurrency"]
    need = math.ceil((spec["warmup"] + spec["measured"]) / c) * wave_s
    if need > seconds:
        raise SystemExit(f"benchmark.cell_seconds: {seconds:g} s is too short for {spec['workload']} at concurrency "
                         f"{c}: its {spec['warmup']} warm-up and {spec['measured']} measured requests take ~{need:.0f} "
                         f"s (one wave of {c} took {wave_s:.1f} s in the server warm-up's second wave); raise it or "
                         "lower benchmark.requests_per_cell")


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="JSON from workflow_scripts.client.cohorts.cohort_plan")
    parser.add_argument("--target", type=Path, required=True, help="target model dir (or SGLang model path)")
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--moe-installed", type=Path, default=None, help="installed.json of the MoE install rule")
    parser.add_argument("--cells-dir", type=Path, required=True, help="the cohort's cache folder")
    parser.add_argument("--server-log-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--meta-out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--supervisor-pid", type=int, default=None,
                        help="stop when this process (the Snakemake that runs the job: $PPID of its shell) is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    plan = json.loads(args.plan)
    installed = json.loads(args.moe_installed.read_text()) if args.moe_installed else None
    cohort = Cohort(plan, Models(args.target, args.draft, installed), args)
    meta = cohort.run()
    records = cohort.records()
    meta["cell_mem_gbs"] = memory_spread(records)
    write_parquet_atomic(records, args.out)
    atomic_write_text(args.meta_out, json.dumps(meta, indent=1))
    log.info("wrote %s and %s", args.out, args.meta_out)


if __name__ == "__main__":
    main()
