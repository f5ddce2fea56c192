"""The summary's account of the machine: how far its memory speed moved around the cells."""

from __future__ import annotations

from workflow_scripts.analysis.measurement import machine_sentence
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
