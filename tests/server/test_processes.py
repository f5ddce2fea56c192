"""Two processes, as SGLang runs them: the front (HTTP) and the engine it starts. Each test here kills one of them
or the whole server, so each starts its own server rather than sharing the session's."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server.conftest import server_process
from workflow_scripts.launcher.process import ServerProcess, free_port

LONG = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}
EXIT_TIMEOUT_S = 30
IDLE_WINDOW_S = 3.0
IDLE_CPU_LIMIT_S = 0.15  # both processes together, over IDLE_WINDOW_S: an idle server must not spin


@pytest.fixture
def server(tiny_models, tmp_path) -> Iterator[ServerProcess]:
    port = free_port()
    proc = server_process(tiny_models["target"], tmp_path / "server.log", port, "--max-running-requests", "2")
    proc.start()
    yield proc
    proc.stop()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _engine_pid(server: ServerProcess) -> int:
    (child,) = _children(server.proc.pid)
    assert "workflow_scripts.engine.engine_process" in Path(f"/proc/{child}/cmdline").read_text()
    return child


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pgid), f"processes of group {pgid} outlived the server"


def _cpu_seconds(pid: int, tid: int | None = None) -> float:
    """The process's CPU time, or one of its threads' (tid)."""
    stat = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_engine_killed_mid_stream(server):
    """The stream ends with an error (no hang), /health turns 503, and the server exits non-zero."""
    body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": LONG}
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line)
        assert json.loads(first.removeprefix("data: "))["meta_info"]["finish_reason"] is None
        os.kill(_engine_pid(server), signal.SIGKILL)
        rest = [json.loads(line.removeprefix("data: ")) for line in lines if line and line != "data: [DONE]"]
    errors = [chunk["error"] for chunk in rest if "error" in chunk]
    assert errors and "engine process exited" in errors[0]["message"], rest[-3:]
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 503
    assert requests.get(server.base_url + "/health_generate", timeout=10).status_code == 503
    assert server.proc.wait(timeout=EXIT_TIMEOUT_S) != 0
    _wait_group_gone(server.proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_leaves_no_process(server, sig):
    """SIGTERM to the front (what a supervisor sends) or SIGINT to the group (Ctrl-C) stops both processes."""
    engine = _engine_pid(server)
    if sig == signal.SIGINT:
        os.killpg(server.proc.pid, sig)
    else:
        os.kill(server.proc.pid, sig)
    assert server.proc.wait(timeout=EXIT_TIMEOUT_S) == -sig  # uvicorn's way: end as the signal would
    _wait_group_gone(server.proc.pid)
    assert not Path(f"/proc/{engine}").exists()
    assert "the engine process did not stop" not in server.log_since_start()  # it stopped in order


def test_front_killed_takes_the_engine(server):
    engine = _engine_pid(server)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=EXIT_TIMEOUT_S)
    _wait_group_gone(server.proc.pid)
    assert not Path(f"/proc/{engine}").exists()


def test_idle_server_costs_no_cpu(server):
    """Several servers of one study stay up while one is measured: an idle one must block, not poll."""
    pids = [server.proc.pid, _engine_pid(server)]
    time.sleep(0.5)  # let the readiness probe's request drain
    before = sum(_cpu_seconds(pid) for pid in pids)
    time.sleep(IDLE_WINDOW_S)
    used = sum(_cpu_seconds(pid) for pid in pids) - before
    assert used < IDLE_CPU_LIMIT_S, f"idle server used {used:.2f} s of CPU in {IDLE_WINDOW_S:.0f} s"


def test_num_threads_sizes_the_engine_process_pools(server):
    """--num-threads 1 (the fixture's) reaches the scheduler thread's OpenMP/MKL pools through the environment."""
    environ = Path(f"/proc/{_engine_pid(server)}/environ").read_bytes().split(b"\0")
    assert b"OMP_NUM_THREADS=1" in environ and b"MKL_NUM_THREADS=1" in environ


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding needs two cores to split")
def test_cpu_binding_puts_the_engine_compute_on_its_cores_and_the_rest_elsewhere(tiny_models, tmp_path):
    """SGLANG_CPU_OMP_THREADS_BIND (SGLang's): the engine thread that runs the forwards is on the named core; the
    engine process's threads that wait on sockets, and every thread of the front, are on the others; the server
    still serves."""
    cores = sorted(os.sched_getaffinity(0))
    port = free_port()
    proc = server_process(tiny_models["target"], tmp_path / "server.log", port)
    proc.env["SGLANG_CPU_OMP_THREADS_BIND"] = str(cores[-1])
    with proc:
        engine = _engine_pid(proc)
        threads = [int(tid) for tid in os.listdir(f"/proc/{engine}/task")]
        before = {tid: _cpu_seconds(engine, tid) for tid in threads}
        body = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}}
        assert requests.post(proc.base_url + "/generate", json=body, timeout=60).status_code == 200
        forwards = max(threads, key=lambda tid: _cpu_seconds(engine, tid) - before[tid])

        assert os.sched_getaffinity(forwards) == set(cores[-1:])
        assert os.sched_getaffinity(engine) == set(cores[:-1]), "the engine's main thread waits on the front"
        assert {frozenset(os.sched_getaffinity(tid)) for tid in threads} == {frozenset(cores[-1:]),
                                                                           frozenset(cores[:-1])}
        front = {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{proc.proc.pid}/task")}
        assert front == {frozenset(cores[:-1])}
