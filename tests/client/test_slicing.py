"""client/slicing.py: the conductor's turns over real processes, and the running clock the records are mapped to."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from workflow_scripts.client.slicing import Conductor, run_share, running_clock, to_running_clock

TURNS = [(10.0, 11.0), (13.0, 14.0), (20.0, 22.0)]


def test_the_running_clock_stands_still_while_the_server_is_frozen():
    clock = running_clock(TURNS)
    t = np.array([5.0, 10.5, 12.0, 13.0, 13.5, 19.0, 21.0, 30.0])
    # before the first turn: its start; frozen between turns: where the last turn ended
    assert clock(t).tolist() == [10.0, 10.5, 11.0, 11.0, 11.5, 12.0, 13.0, 14.0]
    assert run_share(TURNS, 10.0, 22.0) == pytest.approx(4.0 / 12.0)
    with pytest.raises(ValueError, match="never ran"):
        running_clock([])


def test_a_cells_records_move_to_the_running_clock_with_their_latencies():
    frame = pd.DataFrame({"send_ts": [10.2, 10.9], "first_token_ts": [13.5, float("nan")],
                          "chunk_ts": [[13.5, 20.5], []], "end_ts": [20.5, 12.0], "ttft_s": [3.3, float("nan")],
                          "e2e_s": [10.3, float("nan")], "error": [None, "HTTP 500"]})
    out = to_running_clock(frame, TURNS)
    assert out.send_ts.tolist() == pytest.approx([10.2, 10.9])
    assert out.chunk_ts[0] == pytest.approx([11.5, 12.5]) and out.chunk_ts[1] == []
    assert out.ttft_s[0] == pytest.approx(1.3) and math.isnan(out.ttft_s[1])  # 1.3 s of running, not 3.3 of wall
    assert out.e2e_s[0] == pytest.approx(2.3) and math.isnan(out.e2e_s[1])  # an errored request has none
    assert frame.send_ts[0] == 10.2 and frame.ttft_s[0] == 3.3  # the input is not changed


def _spinner() -> subprocess.Popen:
    """A CPU-bound process in a group of its own, as every server is."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_the_conductor_runs_one_group_at_a_time_and_leaves_every_group_running():
    procs = {name: _spinner() for name in ("a", "b")}
    try:
        before = {name: _cpu_s(p.pid) for name, p in procs.items()}
        with Conductor({name: p.pid for name, p in procs.items()}, 0.05, ["a", "b"]) as conductor:
            time.sleep(1.5)
            assert {_state(p.pid) for p in procs.values()} <= {"R", "T", "t"}
            conductor.done("a")  # its turns go to b
            time.sleep(0.5)
            assert _state(procs["a"].pid) == "T"
        used = {name: _cpu_s(p.pid) - before[name] for name, p in procs.items()}
        turns = sorted((start, end, name) for name, spans in conductor.intervals.items() for start, end in spans)
        # turns alternate and never overlap: one group ran at a time
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(turns, turns[1:]))
        assert {name for _, _, name in turns[:2]} == {"a", "b"}
        ran = {name: sum(end - start for start, end, n in turns if n == name) for name in procs}
        assert 0.5 < ran["a"] < 1.0 and ran["b"] > 1.0, ran
        # the CPU each used follows its turns (neither ran while frozen), within the clock tick
        for name in procs:
            assert used[name] <= ran[name] + 0.1, (used, ran)
        assert used["b"] > used["a"] > 0.3, used
        assert {_state(p.pid) for p in procs.values()} <= {"R", "S"}  # both run again after the cell
    finally:
        for p in procs.values():
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_group_gone_before_the_cell_leaves_no_other_group_frozen():
    alive, gone = _spinner(), _spinner()
    os.killpg(gone.pid, signal.SIGKILL)
    gone.wait()
    try:
        with pytest.raises(ProcessLookupError):
            with Conductor({"alive": alive.pid, "gone": gone.pid}, 0.05, ["alive", "gone"]):
                pass
        time.sleep(0.1)
        assert _state(alive.pid) in {"R", "S"}
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        alive.wait()
