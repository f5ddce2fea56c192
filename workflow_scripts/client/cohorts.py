"""Which settings are measured together: the cohorts of the benchmark, planned from the config and the cell cache.

A cohort is a set of settings (its *members*) measured in the same rounds over the same cells, always with the
study's control (`analysis.baseline`) among them, so every comparison in the tables pairs cells of one round.
The planner runs when Snakemake parses the workflow, so `snakemake -n` shows what a config edit will measure:

- a cold study is one cohort: every setting, the control and its A/A twin;
- a (setting, cell) already in some cohort's manifest is *covered*: it is not measured again;
- everything uncovered forms one new cohort, together with a fresh control (re-measured in the new rounds);
  the twin joins only a cohort whose control is new.

A member is identified by everything in the config that shapes what it measures (its args, the server keys, the
engine's source digest, the model and MoE-config recipes), a cell by its workload spec, concurrency and size.
The cohort job writes `cells/{cohort}/manifest.json` when it starts; the manifest is the cohort's plan, so an
interrupted cohort resumes under the same id and a later edit leaves it alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workflow_scripts.client.plan import cell_sizes, setting_workloads
from workflow_scripts.code_version import source_digest

TWIN_SUFFIX = "_aa"
SERVER_KEYS = ("max_running_requests", "random_seed", "num_threads", "env", "incremental_streaming")
MANIFEST = "manifest.json"
# how a cell's requests are seeded (client/cell.seed_base): part of its key, so that cells measured under another
# scheme (one set of seeds for every round) are measured again rather than mixed in
SEEDS = "new streams each round"


def twin_name(control: str) -> str:
    """The A/A twin of the control: the same setting, as a second, independent server."""
    return control + TWIN_SUFFIX


def _digest(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def member_identity(config: dict, name: str, args: dict) -> dict:
    """What in the config shapes one member's measurements (not e.g. its start-up timeout)."""
    engine = config["engine"]
    identity = {
        "name": name,
        "args": args,
        "engine": engine,
        "server": {k: config["server"][k] for k in SERVER_KEYS},
        "api": config["benchmark"]["api"],
    }
    if engine == "embedded":
        # the embedded server is this project's code, engine and HTTP front: an edit to it re-measures
        identity["engine_code"] = source_digest("engine", "server")
        identity["models"] = {**config["model"], "code": source_digest("models")}
    else:
        sg = config["sglang"]
        identity["models"] = {k: sg[k] for k in ("version", "model_path", "draft_path", "tp_size", "mem_fraction_static")}
    if args.get("moe_config") == "tuned":
        identity["moe"] = {**config["moe"], "code": source_digest("moe", "engine")}
    return identity


def cell_specs(config: dict, setting: str) -> list[dict]:
    """The cells of one setting: workload (name and spec) x concurrency, with their request counts."""
    out = []
    for workload in setting_workloads(config, setting):
        for c in config["benchmark"]["concurrency"]:
            warmup, measured = cell_sizes(config, c)
            spec = {"workload": workload, "spec": config["workloads"][workload], "concurrency": c,
                    "warmup": warmup, "measured": measured, "seeds": SEEDS}
            if config["benchmark"]["cell_seconds"] is not None:  # keyed only when set: cached cells stay valid
                spec["seconds"] = config["benchmark"]["cell_seconds"]
            out.append({**spec, "key": _digest(spec, 12)})
    return out


@dataclass(frozen=True)
class Cohort:
    """A cohort's plan: the members (name -> setting args and identity digest), the control, the cells, the schedule."""

    id: str
    control: str
    members: dict[str, dict]  # name -> {"args": setting args, "fp": identity digest, "cells": [cell keys]}
    cells: list[dict]  # every cell any member measures (the control measures them all)
    schedule: str  # as configured (auto is resolved by the job, which knows the machine)

    def manifest(self) -> dict:
        return {"id": self.id, "control": self.control, "members": self.members, "cells": self.cells,
                "schedule": self.schedule}

    def covers(self, name: str, fp: str, cell_key: str) -> bool:
        member = self.members.get(name)
        return member is not None and member["fp"] == fp and cell_key in member["cells"]


def study_members(config: dict) -> dict[str, dict]:
    """Every member the config asks for: the settings, plus the control's twin when `benchmark.aa_control`."""
    members = dict(config["settings"])
    control = config["analysis"]["baseline"]
    if config["benchmark"]["aa_control"]:
        members[twin_name(control)] = config["settings"][control]
    return members


def cohort_label(members: dict, control: str) -> str:
    """The readable part of a cohort's id, so that `snakemake -n` shows what a job measures: `steps3-vs-baseline`,
    or `6-settings-vs-baseline` when the names would make a long file name."""
    names = sorted(name for name in members if name != control)
    label = "+".join(names) if len("+".join(names)) <= 48 else f"{len(names)}-settings"
    return f"{label or 'alone'}-vs-{control}"


def _wanted(config: dict, name: str, args: dict) -> tuple[str, list[dict]]:
    """(identity digest, cells) of one member; the twin is measured exactly like the control, under its own name."""
    control = config["analysis"]["baseline"]
    if name == twin_name(control):
        return _digest(member_identity(config, control, args)) + ":twin", cell_specs(config, control)
    return _digest(member_identity(config, name, args)), cell_specs(config, name)


def read_manifests(cells_root: Path) -> list[Cohort]:
    cohorts = []
    for path in sorted(Path(cells_root).glob(f"*/{MANIFEST}")):
        try:
            data = json.loads(path.read_text())
            cohorts.append(Cohort(data["id"], data["control"], data["members"], data["cells"], data["schedule"]))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{path}: unreadable cohort manifest ({err}); delete that cohort's folder to re-measure it")
    return cohorts


def plan_cohorts(config: dict, cells_root: Path) -> list[Cohort]:
    """The cohorts of the current config: existing ones that still cover a wanted (member, cell), then a new one.

    An existing cohort keeps its id, but only its members that are still wanted as they are take part (an edited or
    removed setting drops out of its job: it is measured in the new cohort, if at all). A cohort measured against
    another control (its args or the study's server keys changed) pairs nothing the tables compare: it is ignored."""
    control = config["analysis"]["baseline"]
    wanted = {name: (args, *_wanted(config, name, args)) for name, args in study_members(config).items()}
    existing = [c for c in read_manifests(cells_root)
                if c.control == control and c.members.get(control, {}).get("fp") == wanted[control][1]]
    used: dict[str, Cohort] = {}
    control_only: dict[str, Cohort] = {}
    uncovered: dict[str, dict] = {}
    uncovered_cells: dict[str, dict] = {}
    for name, (args, fp, cells) in wanted.items():
        for cell in cells:
            cohort = next((c for c in existing if c.covers(name, fp, cell["key"])), None)
            if cohort is not None:
                (control_only if name == control else used)[cohort.id] = cohort
                continue
            uncovered.setdefault(name, {"args": args, "fp": fp, "cells": []})["cells"].append(cell["key"])
            uncovered_cells[cell["key"]] = cell
    if not used and not uncovered:  # a study of the control alone
        used = control_only
    current = {name: fp for name, (_, fp, _) in wanted.items()}
    cohorts = [replace(c, members={n: m for n, m in c.members.items() if current.get(n) == m["fp"]})
               for c in used.values()]
    if uncovered:
        # sorted, so that the id depends on what is measured, not on the order of keys in the config file
        members = {name: {**m, "cells": sorted(m["cells"])} for name, m in sorted(uncovered.items())}
        # the control is always measured afresh in the new rounds, in every cell of them; its twin only when new
        members[control] = {"args": wanted[control][0], "fp": wanted[control][1],
                            "cells": sorted(uncovered_cells)}
        cells = sorted(uncovered_cells.values(), key=lambda c: (c["workload"], c["concurrency"]))
        schedule = config["benchmark"]["schedule"]
        plan = {"control": control, "members": members, "cells": cells, "schedule": schedule}
        cohorts.append(Cohort(f"{cohort_label(members, control)}-{_digest(plan, 8)}", control, members, cells,
                              schedule))
    return cohorts


def coverage(config: dict, cohorts: list[Cohort]) -> dict[str, list[list]]:
    """member name -> [cohort id, workload, concurrency] of every cell of its rows the analysis reads.

    A member's rows come from the cohorts that hold its current identity for a current cell (the control: from
    each cohort, with that cohort's fresh rounds); rows of an edited or removed cell stay in the cache, unread."""
    wanted = {name: _wanted(config, name, args) for name, args in study_members(config).items()}
    out: dict[str, list[list]] = {name: [] for name in wanted}
    for cohort in cohorts:
        for name, (fp, cells) in wanted.items():
            member = cohort.members.get(name)
            if member is None or member["fp"] != fp:
                continue
            for cell in cells:
                if cell["key"] in member["cells"]:
                    out[name].append([cohort.id, cell["workload"], cell["concurrency"]])
    return out


def cohort_plan(config: dict, cohort: Cohort) -> dict:
    """The cohort job's params: its manifest plus what runs it (server, engine, rounds and budget knobs)."""
    bench, server = config["benchmark"], config["server"]
    return {
        **cohort.manifest(),
        "engine": config["engine"],
        "server": {k: server[k] for k in (*SERVER_KEYS, "host", "startup_timeout_s")},
        "sglang": config["sglang"] if config["engine"] == "sglang" else None,
        "api": bench["api"],
        "request_timeout_s": bench["request_timeout_s"],
        "rounds": {k: bench[k] for k in ("repeats", "max_repeats", "precision_pct", "time_budget_min", "allocation",
                                         "equivalence_pct")},
        "seed": bench["seed"],
        "restart_each_round": bench["restart_each_round"],
        "counterbalance_launches": bench["counterbalance_launches"],
        "slice_ms": bench["slice_ms"],
        "server_warmup": bench["server_warmup"],
        "node_gpus": config["sglang"]["node_gpus"] if config["engine"] == "sglang" else None,
    }
