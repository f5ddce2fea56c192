"""One cohort job for real (client/run_cohort.py): smoke servers on loopback, rounds, the cache, and signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import validate

from workflow_scripts.client.cohorts import cohort_plan, plan_cohorts
from workflow_scripts.client.rounds import launch_order
from workflow_scripts.client.liveness import pid_alive

REPO = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, **bench) -> dict:
    """The smoke study cut to the baseline and its twin, one synthetic cell, two rounds (`bench`: more keys)."""
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config["settings"] = {"baseline": {"moe_config": "default"}}
    config["workloads"] = {"synthetic": config["workloads"]["synthetic"]}
    config["benchmark"].update(concurrency=[2], repeats=2, max_repeats=2, **bench)
    validate(config, str(REPO / "config" / "schema.yaml"), set_default=True)
    (cohort,) = plan_cohorts(config, tmp_path / "cells")
    return cohort_plan(config, cohort)


def _argv(plan: dict, smoke_pair, tmp_path: Path) -> list[str]:
    target, draft = smoke_pair
    return [sys.executable, "-m", "workflow_scripts.client.run_cohort", "--plan", json.dumps(plan),
            "--target", str(target), "--draft", str(draft), "--cells-dir", str(tmp_path / "cells" / plan["id"]),
            "--server-log-dir", str(tmp_path / "servers"), "--out", str(tmp_path / "out.parquet"),
            "--meta-out", str(tmp_path / "out.json"), "--threads", "1"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")


def _until_first_cell(argv: list[str]) -> tuple[subprocess.Popen, list[int]]:
    """Start a long cohort job; return it and its servers' pids once a cell finished (its servers are all up)."""
    proc = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    for line in proc.stderr:
        pids += [int(pid) for pid in re.findall(r"started server pid (\d+)", line)]
        if "cell baseline" in line:
            break
    assert len(pids) == 2, pids
    return proc, pids


def _long(tmp_path: Path) -> dict:
    plan = _plan(tmp_path)
    plan["rounds"]["repeats"] = plan["rounds"]["max_repeats"] = 8
    plan["counterbalance_launches"] = False  # the servers seen after the first cell stay up for every round
    return plan


def test_a_cohort_measures_its_rounds_and_a_damaged_cache_file_is_measured_again(smoke_pair, tmp_path):
    plan = _plan(tmp_path)
    done = subprocess.run(_argv(plan, smoke_pair, tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "out.parquet")
    assert sorted(records.groupby(["setting", "repeat"]).groups) == [
        ("baseline", 0), ("baseline", 1), ("baseline_aa", 0), ("baseline_aa", 1)]
    for _, cell in records.groupby(["setting", "repeat"]):  # the server's own count beside the client's
        server = json.loads(cell.cell_server_metrics.iloc[0])
        assert server["sglang:generation_tokens_total"] == cell.output_tokens.sum()
        assert server["sglang:num_requests_total"] == len(cell)
        # over the steady window (first measured send to the (N - C + 1)-th end) the server generated what the
        # client received inside it, give or take what the smoke model (a forward is ~1 ms) decoded while each
        # edge's scrape was on its way: at most one answer of the last request (16 tokens)
        window = json.loads(cell.window_server_metrics.iloc[0])
        opens, closes = cell[~cell.warmup].send_ts.min(), sorted(cell.end_ts)[len(cell) - 2]
        inside = sum(n for ts, ns in zip(cell.chunk_ts, cell.chunk_tokens)
                     for t, n in zip(ts, ns) if opens < t <= closes)
        assert abs(window["sglang:generation_tokens_total"] - inside) <= 16
        assert 0 < window["sglang:generation_tokens_total"] <= server["sglang:generation_tokens_total"]
        assert 0 < window["specstudy:decode_forwards_total"] <= server["specstudy:decode_forwards_total"]
    meta = json.loads((tmp_path / "out.json").read_text())
    assert meta["schedule"] == "sliced" and meta["cells"][0]["rounds"] == 2 and meta["mem_bandwidth_gbs"] > 0
    # the servers started in the order shuffled from benchmark.seed, which the meta records, as it does each sliced
    # cell's turn order
    assert meta["allocation"] == "racing" and meta["seed"] == plan["seed"]
    # (benchmark.counterbalance_launches) and started again in the reverse order for the second round
    order = launch_order(["baseline", "baseline_aa"], plan["seed"], plan["id"])
    assert meta["launch_order"] == {"0": order, "1": order[::-1]}
    warmed = re.findall(r"server (\S+) warmed up", done.stderr)  # each server is warmed right after its start
    assert warmed == order + order[::-1] and len(re.findall(r"started server pid \d+", done.stderr)) == 4
    assert len(meta["turn_order"]) == 2
    assert all(sorted(order) == ["baseline", "baseline_aa"] for order in meta["turn_order"].values())
    # auto on the embedded engine: both members' cells of a round ran at once, each server in its turns, and
    # their records are on their server's running clock: a span of each cell shorter than the wall time it took
    for _, cell in records.groupby(["setting", "repeat"]):
        share = cell.cell_run_share.iloc[0]
        assert 0.3 < share < 1.0, share
        span = cell.end_ts.max() - cell.send_ts.min()
        assert span < cell.cell_wall_s.iloc[0] * (share + 0.1), (span, cell.cell_wall_s.iloc[0], share)
    # the machine's memory speed, probed around each of the 4 cells
    per_cell = records.groupby(["setting", "repeat"]).cell_mem_gbs.agg(["min", "max"])
    assert (per_cell["min"] == per_cell["max"]).all() and (per_cell["min"] > 0).all()
    spread = meta["cell_mem_gbs"]
    assert spread["cells"] == 4 and 0 < spread["p5"] <= spread["median"] <= spread["p95"]
    # each server served its unrecorded warm-up wave before its first measured cell
    for member in ("baseline", "baseline_aa"):
        warmed = done.stderr.index(f"server {member} warmed up")
        assert warmed < done.stderr.index(f"cell {member}-synthetic-c2-r0")
    assert not records.request_id.str.contains("warmup").any()
    cached = sorted((tmp_path / "cells" / plan["id"]).glob("*/*.parquet"))
    assert len(cached) == 4
    damaged = next(path for path in cached if "-r1-" in path.name)  # a cell of the second launch's round
    damaged.write_bytes(damaged.read_bytes()[:100])  # a truncated cell on disk
    again = subprocess.run(_argv(plan, smoke_pair, tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is unreadable" in again.stderr and "3 cached cell-rounds" in again.stderr
    assert len(pd.read_parquet(damaged)) == len(records) // 4  # measured again, whole
    # only the launch that measures round 1 starts again, in its own order, and the cached round 0 keeps the
    # positions of the launch that measured it: the start-position fit sees both launches
    assert re.findall(r"server (\S+) warmed up", again.stderr) == order[::-1]
    assert json.loads((tmp_path / "out.json").read_text())["launch_order"] == {"0": order, "1": order[::-1]}


def test_sigterm_stops_every_server_and_leaves_no_output(smoke_pair, tmp_path):
    plan = _long(tmp_path)
    proc, pids = _until_first_cell(_argv(plan, smoke_pair, tmp_path))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not any(pid_alive(pid) for pid in pids), "a server outlived its cohort job"
    assert not (tmp_path / "out.parquet").exists() and not (tmp_path / "out.json").exists()


def test_a_hung_server_fails_the_cohort_long_before_the_request_timeout(smoke_pair, tmp_path):
    """SIGSTOP on one server mid-cell: the liveness check beside the cell fails the job (the request timeout is 300 s).
    Interleaved: a sliced cell's conductor continues every server in its turn, so SIGSTOP is no hang there."""
    plan = _long(tmp_path)
    plan["schedule"] = "interleaved"
    proc, pids = _until_first_cell(_argv(plan, smoke_pair, tmp_path))
    os.killpg(pids[0], signal.SIGSTOP)  # the server and its engine process: a hang, not a crash
    stopped = time.monotonic()
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) != 0
    assert time.monotonic() - stopped < 60
    assert "stopped answering /health during a cell" in rest
    assert not any(pid_alive(pid) for pid in pids)


def test_a_damaged_model_fails_in_one_line_before_any_server_starts(smoke_pair, tmp_path):
    target, draft = smoke_pair
    damaged = tmp_path / "target"
    shutil.copytree(target, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    argv = _argv(_plan(tmp_path), (damaged, draft), tmp_path)
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "started server" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"{weights}: damaged model weights")


def test_a_port_taken_between_its_choice_and_the_bind_is_replaced(smoke_pair, tmp_path):
    """Another process binds the chosen port while the server loads: the launcher starts it again on another."""
    plan = _plan(tmp_path)
    proc = subprocess.Popen(_argv(plan, smoke_pair, tmp_path), env=_env(), stderr=subprocess.PIPE, text=True)
    squatter, retried = None, False
    for line in proc.stderr:
        found = re.search(r"started server pid \d+: .* --port (\d+)", line)
        if found and squatter is None:
            squatter = socket.socket()
            squatter.bind(("127.0.0.1", int(found.group(1))))
            squatter.listen()
        if "retrying on another" in line:
            retried = True
            break
    rest = proc.stderr.read()
    assert retried, "the squatter lost the race: the server bound its port first"
    assert proc.wait(timeout=300) == 0, rest[-3000:]
    squatter.close()
    assert (tmp_path / "out.parquet").is_file()


def test_the_job_stops_when_its_snakemake_is_gone(smoke_pair, tmp_path):
    """Snakemake SIGKILLed leaves its jobs running; the cohort job notices before its next cell and stops its servers."""
    plan = _long(tmp_path)
    supervisor = subprocess.Popen(["sleep", "600"])
    proc, pids = _until_first_cell(_argv(plan, smoke_pair, tmp_path) + ["--supervisor-pid", str(supervisor.pid)])
    supervisor.kill()
    supervisor.wait()
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) != 0
    assert f"(pid {supervisor.pid}) is gone: stopping" in rest
    assert not any(pid_alive(pid) for pid in pids) and not (tmp_path / "out.parquet").exists()


def test_a_server_killed_mid_cell_fails_the_cohort_and_keeps_the_finished_cells(smoke_pair, tmp_path):
    plan = _long(tmp_path)
    proc, pids = _until_first_cell(_argv(plan, smoke_pair, tmp_path))
    os.killpg(pids[0], signal.SIGKILL)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) != 0 and "ServerError" in rest and "died" in rest
    finished = list((tmp_path / "cells" / plan["id"]).glob("*/*.parquet"))
    assert finished and all(len(pd.read_parquet(path)) for path in finished)  # whole cells, none half-written


def test_a_time_boxed_cell_measures_past_its_minimum_and_one_too_short_fails_naming_the_key(smoke_pair, tmp_path):
    plan = _plan(tmp_path, cell_seconds=1.0)
    (spec,) = plan["cells"]
    done = subprocess.run(_argv(plan, smoke_pair, tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "out.parquet")
    for _, cell in records.groupby(["setting", "repeat"]):
        # a smoke request takes milliseconds: a second of the server's running clock holds far more than the minimum
        assert (~cell.warmup).sum() > 2 * spec["measured"] and cell.error.isna().all()
        assert cell.end_ts.max() - cell.send_ts.min() < 1.0 + 0.5  # on the running clock, the last wave included
    short = _plan(tmp_path / "short", cell_seconds=0.001)
    failed = subprocess.run(_argv(short, smoke_pair, tmp_path / "short"), env=_env(), capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode != 0 and "benchmark.cell_seconds: 0.001 s is too short for synthetic at concurrency 2" \
        in failed.stderr, failed.stderr[-3000:]
    assert not (tmp_path / "short" / "out.json").exists()


def test_fresh_servers_each_round_when_asked(smoke_pair, tmp_path):
    plan = _plan(tmp_path)
    plan["restart_each_round"] = True
    plan["server_warmup"] = False
    done = subprocess.run(_argv(plan, smoke_pair, tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"started server pid \d+", done.stderr)) == 2 * 2  # 2 members x 2 rounds
    assert "warmed up" not in done.stderr  # benchmark.server_warmup: false
    meta = json.loads((tmp_path / "out.json").read_text())
    assert meta["launch_order"] == {str(r): launch_order(["baseline", "baseline_aa"], plan["seed"], plan["id"], r)
                                    for r in range(2)}
    again = subprocess.run(_argv(plan, smoke_pair, tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "started server" not in again.stderr  # every cell cached: no server at all
