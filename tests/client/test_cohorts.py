"""Cohort planning (client/cohorts.py): what a config edit measures, read from the manifests of earlier cohorts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from snakemake.utils import validate

from workflow_scripts.client.cohorts import MANIFEST, cohort_plan, coverage, plan_cohorts, twin_name

REPO = Path(__file__).resolve().parents[2]


def _config(**edits) -> dict:
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    for key, value in edits.items():
        config[key] = value
    validate(config, str(REPO / "config" / "schema.yaml"), set_default=True)
    return config


def _started(cells_root: Path, config: dict, cohort) -> None:
    """What the cohort job does first: write its manifest (the plan without the run knobs)."""
    plan = cohort_plan(config, cohort)
    path = cells_root / cohort.id / MANIFEST
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({k: plan[k] for k in ("id", "control", "members", "cells", "schedule")}))


def test_a_cold_study_is_one_cohort_of_every_setting_and_the_twin(tmp_path):
    config = _config()
    (cohort,) = plan_cohorts(config, tmp_path)
    assert set(cohort.members) == {*config["settings"], twin_name("baseline")}
    assert all(len(m["cells"]) == 4 for m in cohort.members.values())
    assert plan_cohorts(config, tmp_path)[0].id == cohort.id  # deterministic


def test_a_new_setting_makes_a_cohort_of_it_and_a_fresh_control(tmp_path):
    config = _config()
    (first,) = plan_cohorts(config, tmp_path)
    _started(tmp_path, config, first)
    (again,) = plan_cohorts(config, tmp_path)
    assert again == first  # read back from its manifest: resumed under the same id
    edited = copy.deepcopy(config)
    edited["settings"]["steps3"] = dict(config["settings"]["steps2"], speculative_num_steps=3,
                                        speculative_num_draft_tokens=4)
    old, new = plan_cohorts(edited, tmp_path)
    assert old.id == first.id and set(new.members) == {"steps3", "baseline"} and new.control == "baseline"
    cover = coverage(edited, [old, new])
    assert {c[0] for c in cover["steps3"]} == {new.id}
    assert {c[0] for c in cover["baseline"]} == {first.id, new.id}  # the control: each cohort's own rounds
    assert {c[0] for c in cover["steps1"]} == {first.id}


def test_an_edited_setting_is_measured_again_and_leaves_its_old_cohort(tmp_path):
    config = _config()
    (first,) = plan_cohorts(config, tmp_path)
    _started(tmp_path, config, first)
    edited = copy.deepcopy(config)
    edited["settings"]["steps2"]["max_running_requests"] = 4
    old, new = plan_cohorts(edited, tmp_path)
    assert set(new.members) == {"steps2", "baseline"}
    assert old.id == first.id and "steps2" not in old.members  # a rerun of the old cohort no longer starts it
    assert {c[0] for c in coverage(edited, [old, new])["steps2"]} == {new.id}


def test_a_new_concurrency_measures_only_its_cells_on_every_member(tmp_path):
    config = _config()
    (first,) = plan_cohorts(config, tmp_path)
    _started(tmp_path, config, first)
    edited = copy.deepcopy(config)
    edited["benchmark"]["concurrency"] = [1, 4, 2]
    old, new = plan_cohorts(edited, tmp_path)
    assert set(new.members) == {*config["settings"], twin_name("baseline")}
    assert [c["concurrency"] for c in new.cells] == [2, 2]  # one per workload


def test_a_new_control_invalidates_every_comparison(tmp_path):
    config = _config()
    (first,) = plan_cohorts(config, tmp_path)
    _started(tmp_path, config, first)
    edited = copy.deepcopy(config)
    edited["settings"]["baseline"]["max_running_requests"] = 4  # only the control's identity changes
    (new,) = plan_cohorts(edited, tmp_path)
    assert new.id != first.id and set(new.members) == set(first.members)


def test_a_setting_removed_after_a_failed_cohort_is_not_started_again(tmp_path):
    """A cohort that failed on a bad flag: once the flag is fixed, the old cohort reruns without that setting,
    and the fixed one is measured in a new cohort with a fresh control."""
    config = _config()
    config["settings"]["steps2"]["extra_args"] = ["--no-such-flag"]
    (failed,) = plan_cohorts(config, tmp_path)
    _started(tmp_path, config, failed)
    fixed = copy.deepcopy(config)
    fixed["settings"]["steps2"]["extra_args"] = []
    old, new = plan_cohorts(fixed, tmp_path)
    assert old.id == failed.id and set(old.members) == {"baseline", "baseline_aa", "steps1", "ngram"}
    assert set(new.members) == {"baseline", "steps2"}


def test_the_id_does_not_depend_on_the_order_of_keys_in_the_config(tmp_path):
    config = _config()
    reordered = copy.deepcopy(config)
    reordered["workloads"] = dict(reversed(config["workloads"].items()))
    reordered["settings"] = dict(reversed(config["settings"].items()))
    assert plan_cohorts(config, tmp_path)[0].id == plan_cohorts(reordered, tmp_path)[0].id


def test_an_unreadable_manifest_is_named(tmp_path):
    (tmp_path / "cohort-x").mkdir()
    (tmp_path / "cohort-x" / MANIFEST).write_text("{not json")
    try:
        plan_cohorts(_config(), tmp_path)
    except ValueError as err:
        assert "cohort-x/manifest.json" in str(err) and "delete that cohort" in str(err)
    else:
        raise AssertionError("a broken manifest was read")
