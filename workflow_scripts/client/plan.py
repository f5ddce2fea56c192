"""What one setting's benchmark job measures, derived from the validated config.

The plan is the benchmark rule's `params`: it holds only what affects this setting's measurements, so adding
another setting or editing an unrelated key leaves this setting's job untouched, while adding a concurrency
level or a workload re-runs the job (which then measures only the cells it has not cached).
"""

from __future__ import annotations

import json

from workflow_scripts.code_version import source_digest

def cell_sizes(config: dict, concurrency: int) -> tuple[int, int]:
    """(warm-up, measured) requests of a cell: enough to keep `concurrency` streams busy several times over."""
    bench = config["benchmark"]
    per = bench["requests_per_cell"]
    warmup = concurrency if bench["warmup_requests"] is None else bench["warmup_requests"]
    return warmup, max(per["min"], per["per_concurrency"] * concurrency)


def setting_workloads(config: dict, setting: str) -> list[str]:
    names = config["settings"][setting].get("workloads")
    return list(config["workloads"]) if names is None else list(names)


def setting_plan(config: dict, setting: str) -> dict:
    bench = config["benchmark"]
    server = config["server"]
    workloads = setting_workloads(config, setting)
    return {
        "engine": config["engine"],
        "setting": setting,
        "args": config["settings"][setting],
        "server": {
            "host": server["host"],
            "max_running_requests": server["max_running_requests"],
            "random_seed": server["random_seed"],
            "startup_timeout_s": server["startup_timeout_s"],
            "num_threads": server["num_threads"],
            "env": server["env"],
            "incremental_streaming": server["incremental_streaming"],
        },
        "sglang": config["sglang"] if config["engine"] == "sglang" else None,
        # the embedded server is this package's code: an edit to it re-measures (SGLang reports its own version)
        "engine_code": source_digest("engine", "server") if config["engine"] == "embedded" else None,
        "workloads": {name: config["workloads"][name] for name in workloads},
        "concurrency": bench["concurrency"],
        "repeats": bench["repeats"],
        "cells": {str(c): cell_sizes(config, c) for c in bench["concurrency"]},
        "api": bench["api"],
        "request_timeout_s": bench["request_timeout_s"],
    }


def plan_json(config: dict, setting: str) -> str:
    return json.dumps(setting_plan(config, setting), sort_keys=True)
