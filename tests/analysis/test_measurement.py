"""The summary's account of the machine: how far its memory speed moved around the cells."""

from __future__ import annotations

import math

import pandas as pd

from workflow_scripts.analysis.measurement import design_lines, floor_sentence, machine_sentence
from workflow_scripts.machine import memory_speed_gbs


def test_a_quiet_and_a_busy_host_are_told_apart():
    quiet = machine_sentence({"p5": 23.5, "median": 24.6, "p95": 25.4, "cells": 210})
    assert quiet == ("The machine's memory speed, probed around each of 210 cells: median 24.6 GB/s, "
                     "5–95% 23.5–25.4 GB/s (×1.08).")
    busy = machine_sentence({"p5": 10.0, "median": 17.0, "p95": 25.0, "cells": 168})
    assert "(×2.50): a busy host" in busy and "A/A gap" in busy


def test_the_cell_probe_reads_a_plausible_memory_speed():
    speeds = [memory_speed_gbs() for _ in range(3)]
    assert all(0.5 < s < 500 for s in speeds), speeds  # GB/s of one thread streaming 32 MB


def test_cells_of_one_round_count_as_having_no_ci_not_as_excluding_0():
    """A budget that ends after round 0 leaves cells with a ratio and no interval: the honesty share is over the
    cells that have one, and the precision line says "no CI" instead of "±nan%"."""
    nan = math.nan
    aa = pd.DataFrame({"workload": ["synthetic"] * 4, "concurrency": [1, 1, 4, 4],
                       "metric": ["aggregate_tok_s", "per_request_tok_s"] * 2, "diff_pct": [1.0, -2.0, 3.0, 4.0],
                       "ci_low_pct": [-1.0, -5.0, nan, nan], "ci_high_pct": [3.0, 1.0, nan, nan]})
    text = floor_sentence({"noise_floor_pct": 4.0}, aa)
    assert "included 0 in 100% of the 2 cells × metrics with a CI (2 more had one round: no CI)" in text
    precision = pd.DataFrame({"cohort": ["c", "c"], "workload": ["synthetic"] * 2, "concurrency": [1, 4],
                              "rounds": [2, 1], "half_width_pct": [12.5, nan], "precision_met": [False, False]})
    meta = {"cohort": "c", "members": ["baseline"], "schedule": "sliced", "schedule_configured": "auto",
            "repeats": 3, "max_repeats": 8, "precision_pct": 3, "time_budget_min": 15, "budget_hit": True,
            "measuring_s": 900, "member_s": {"baseline": 900}, "mem_bandwidth_gbs": 11.0,
            "cells": [{"workload": "synthetic", "concurrency": 1}, {"workload": "synthetic", "concurrency": 4}]}
    lines = design_lines([meta], precision)
    assert "synthetic C=1 ±12.5%, synthetic C=4 one round, no CI" in lines[1] and "nan" not in lines[1]
    assert not any("Out of reach" in line for line in lines)
    meta["cells"][0]["out_of_reach_round"] = 2  # racing stopped it: no round could decide it
    assert "Out of reach of 8 rounds at their leads and spread, so given no more (docs/racing.md): synthetic C=1 " \
           "after 2." in design_lines([meta], precision)[2]
