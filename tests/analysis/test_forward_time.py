"""forward_time.py reads the forward times over the cell's steady window, and the whole cell's only in records from
before the window was scraped."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workflow_scripts.analysis.forward_time import forward_times


def _metrics(decode_s: float, extend_s: float, forwards: float, tokens: float) -> str:
    return json.dumps({"specstudy:decode_forward_seconds_total": decode_s, "specstudy:decode_forwards_total": forwards,
                       "specstudy:extend_forward_seconds_total": extend_s, "specstudy:mixed_forward_seconds_total": 0.0,
                       "sglang:generation_tokens_total": tokens})


def _cell(repeat: int, window: str | None) -> list[dict]:
    # the whole cell: the warm-up wave's prefill and a drain of one-row forwards (cheap) besides the window
    whole = _metrics(decode_s=6.0, extend_s=4.0, forwards=200, tokens=2000)
    return [{"setting": "steps2", "workload": "synthetic", "concurrency": 16, "repeat": repeat,
             "cell_server_metrics": whole, "window_server_metrics": window} for _ in range(3)]


def test_the_steady_window_is_read_where_the_cell_has_one_and_the_whole_cell_where_it_has_not():
    window = _metrics(decode_s=4.0, extend_s=1.0, forwards=50, tokens=1000)
    times = forward_times(pd.DataFrame(_cell(0, window)))
    assert times.loc[0, "extend_share"] == pytest.approx(1.0 / 5.0)
    assert times.loc[0, "decode_s_per_forward"] == pytest.approx(4.0 / 50)
    assert times.loc[0, "extend_s_per_token"] == pytest.approx(1.0 / 1000)
    old = forward_times(pd.DataFrame(_cell(0, None)))
    assert old.loc[0, "extend_share"] == pytest.approx(4.0 / 10.0)
    assert old.loc[0, "decode_s_per_forward"] == pytest.approx(6.0 / 200)
    # rounds of both kinds in one setting: the median over the rounds of what each one has
    mixed = forward_times(pd.DataFrame(_cell(0, window) + _cell(1, None) + _cell(2, window)))
    assert mixed.loc[0, "extend_share"] == pytest.approx(0.2)


def test_a_time_sliced_cell_is_read_with_the_cpu_clock_and_has_no_forward_times_without_it():
    """Its server was frozen mid-forward by the other members' turns: the wall seconds are not the forwards' own,
    the engine thread's CPU seconds are."""
    alone = [{**row, "cell_run_share": None} for row in _cell(0, _metrics(4.0, 1.0, forwards=50, tokens=1000))]
    wall_only = _metrics(40.0, 1.0, forwards=50, tokens=1000)
    sliced = [{**row, "cell_run_share": 0.5} for row in _cell(1, wall_only)]
    times = forward_times(pd.DataFrame(alone + sliced))
    assert times.loc[0, "decode_s_per_forward"] == pytest.approx(4.0 / 50)  # round 1 (sliced, no CPU clock) left out
    assert forward_times(pd.DataFrame(sliced)).empty
    cpu = json.loads(wall_only) | {"specstudy:decode_forward_cpu_seconds_total": 3.0,
                                   "specstudy:extend_forward_cpu_seconds_total": 1.0,
                                   "specstudy:mixed_forward_cpu_seconds_total": 0.0}
    with_cpu = forward_times(pd.DataFrame([{**row, "window_server_metrics": json.dumps(cpu)} for row in sliced]))
    assert with_cpu.loc[0, "decode_s_per_forward"] == pytest.approx(3.0 / 50)
    assert with_cpu.loc[0, "extend_share"] == pytest.approx(1.0 / 4.0)


def test_the_rows_a_decode_forward_verified_are_read_where_the_server_counts_verifies():
    """One verify per row: 720 verifies over 50 decode forwards at C=16 are 14.4 rows a forward (the slots of
    finished requests wait for their successors' prefill); a cell without speculation has none to count."""
    window = json.loads(_metrics(decode_s=4.0, extend_s=1.0, forwards=50, tokens=1000))
    spec = window | {"sglang:spec_verify_calls_total": 720.0}
    plain = window | {"sglang:spec_verify_calls_total": 0.0}
    times = forward_times(pd.DataFrame(_cell(0, json.dumps(spec)) + [
        {**row, "setting": "baseline"} for row in _cell(0, json.dumps(plain))]))
    rows = times.set_index("setting")["rows_per_forward"]
    assert rows["steps2"] == pytest.approx(14.4)
    assert pd.isna(rows["baseline"])
