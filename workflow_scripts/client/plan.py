"""The cells of a setting, derived from the validated config: its workloads and each cell's request counts."""

from __future__ import annotations


def cell_sizes(config: dict, concurrency: int) -> tuple[int, int]:
    """(warm-up, measured) requests of a cell: enough to keep `concurrency` streams busy several times over."""
    bench = config["benchmark"]
    per = bench["requests_per_cell"]
    warmup = concurrency if bench["warmup_requests"] is None else bench["warmup_requests"]
    return warmup, max(per["min"], per["per_concurrency"] * concurrency)


def setting_workloads(config: dict, setting: str) -> list[str]:
    names = config["settings"][setting].get("workloads")
    return list(config["workloads"]) if names is None else list(names)
