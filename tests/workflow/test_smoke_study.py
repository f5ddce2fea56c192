"""The real study end to end on config/smoke.yaml: real model build, real servers, real Snakemake; then
partial re-execution after config edits, an interrupted run, and a broken server."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from tests.workflow.snakemake_run import REPO, planned_jobs, planned_wildcards, snakemake, snakemake_argv, snakemake_env
from workflow_scripts.analysis.browser_check import check_report
from workflow_scripts.client.plan import cell_sizes

SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
SMOKE_VALIDATED = copy.deepcopy(SMOKE)
validate(SMOKE_VALIDATED, str(REPO / "config" / "schema.yaml"), set_default=True)
SPECULATING = [name for name, s in SMOKE["settings"].items() if s.get("speculative_algorithm")]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """One full cold run of the smoke study; the tests below read it and then edit its config."""
    workdir = tmp_path_factory.mktemp("smoke-study")
    snakemake(workdir, SMOKE, "--cores", "2", timeout=900)
    return workdir


def results(workdir: Path) -> Path:
    return workdir / "results" / SMOKE["study"]


def test_artifacts_exist(study):
    res = results(study)
    for name in ("target", "draft"):
        info = json.loads((res / "models" / name / "build_info.json").read_text())
        assert info["seed"] == SMOKE["model"]["seed"]
    for setting in SMOKE["settings"]:
        assert (res / "requests" / f"{setting}.parquet").is_file()
        assert (res / "logs" / "server" / f"{setting}.log").stat().st_size > 0
    summary = pd.read_csv(res / "tables" / "summary.csv")
    measured = summary[summary.source == "measured"]
    expected_rows = len(SMOKE["settings"]) * len(SMOKE["workloads"]) * len(SMOKE["benchmark"]["concurrency"])
    assert len(measured) == expected_rows


def test_every_request_accounted_for_and_values_sane(study):
    res = results(study)
    frames = pd.concat(pd.read_parquet(res / "requests" / f"{s}.parquet") for s in SMOKE["settings"])
    cells = frames.groupby(["setting", "workload", "concurrency", "repeat"])
    assert cells.ngroups == len(SMOKE["settings"]) * len(SMOKE["workloads"]) * 2 * SMOKE["benchmark"]["repeats"]
    for (setting, workload, c, repeat), cell in cells:
        warmup, measured = cell_sizes(SMOKE_VALIDATED, c)
        sent = warmup + measured
        completed = int(cell.error.isna().sum())
        errored = int(cell.error.notna().sum())
        assert completed + errored == sent, (setting, workload, c, repeat)
        assert int(cell.warmup.sum()) == warmup
    ok = frames[frames.error.isna()]
    assert len(ok) == len(frames), frames[frames.error.notna()].error.head().tolist()
    assert (ok.output_tokens > 0).all()
    synthetic = ok[ok.workload == "synthetic"]
    assert (synthetic.output_tokens == SMOKE["workloads"]["synthetic"]["output_len"]).all()
    assert (synthetic.finish_reason == "length").all()
    summary = pd.read_csv(results(study) / "tables" / "summary.csv")
    measured = summary[summary.source == "measured"]
    assert (measured.per_request_tok_s_median > 0).all() and (measured.aggregate_tok_s_median > 0).all()
    spec = measured[measured.setting.isin(SPECULATING)]
    assert (spec.accept_length_mean > 1).all(), spec[["setting", "workload", "concurrency", "accept_length_mean"]]
    assert (measured.n_err == 0).all()


def test_acceptance_by_position_and_cost_model(study):
    """Every speculative request carries SGLang's histogram, consistent with its counts; the analysis turns them
    into per-position acceptance and a validated cost model."""
    res = results(study)
    frames = pd.concat(pd.read_parquet(res / "requests" / f"{s}.parquet") for s in SMOKE["settings"])
    spec = frames[frames.setting.isin(SPECULATING)]
    for row in spec.itertuples():
        steps = SMOKE["settings"][row.setting]["speculative_num_steps"]
        histogram = list(row.spec_correct_drafts_histogram)
        assert sum(histogram) == row.spec_verify_ct and len(histogram) <= steps + 1, row.request_id
        assert sum(i * n for i, n in enumerate(histogram)) == row.spec_num_correct_drafts
        assert row.spec_num_proposed_drafts == row.spec_verify_ct * steps
    plain = frames[~frames.setting.isin(SPECULATING)]
    assert plain.spec_correct_drafts_histogram.isna().all() and plain.spec_num_proposed_drafts.isna().all()
    by_position = pd.read_csv(res / "tables" / "acceptance_by_position.csv")
    expected = {(s, w, p) for s in SPECULATING for w in SMOKE["workloads"]
                for p in range(1, SMOKE["settings"][s]["speculative_num_steps"] + 1)}
    assert set(zip(by_position.setting, by_position.workload, by_position.position)) == expected
    assert (by_position.n_bad_histograms == 0).all()
    validation = pd.read_csv(res / "tables" / "cost_model_validation.csv")
    assert set(validation.left_out) == {"steps1", "steps2"}  # the STANDALONE family; ngram is another drafter
    predictions = pd.read_csv(res / "tables" / "cost_model_predictions.csv")
    assert set(predictions.steps) == set(range(0, 7))  # analysis.predict_max_steps defaults to 6
    recommendation = pd.read_csv(res / "tables" / "recommendation.csv")
    assert recommendation.predicted_best_steps.notna().all()


def test_report_renders_in_a_real_browser(study):
    """`snakemake --report` on the real study, opened in headless Chromium: every chart draws marks."""
    report = results(study) / "report.html"
    snakemake(study, SMOKE, "--report", str(report), timeout=300)
    charts = check_report(report, timeout=120)
    assert len(charts) >= 5 and all(chart.marks > 0 for chart in charts)
    summary = (results(study) / "summary.md").read_text()
    assert "ecommend" in summary and "lossless" in summary.lower()


def test_rerun_with_nothing_changed_has_nothing_to_do(study):
    assert planned_jobs(study, SMOKE) == {}


def test_new_setting_runs_only_its_benchmark_and_the_analysis(study):
    config = copy.deepcopy(SMOKE)
    config["settings"]["steps3"] = dict(config["settings"]["steps2"], speculative_num_steps=3, speculative_num_draft_tokens=4)
    jobs = planned_jobs(study, config)
    assert jobs.get("benchmark") == 1
    assert planned_wildcards(study, config, "benchmark") == ["setting=steps3"]
    assert "build_models" not in jobs and not any(rule.startswith("moe_") for rule in jobs)


def test_model_build_change_reruns_everything_downstream(study):
    config = copy.deepcopy(SMOKE)
    config["model"]["seed"] = 1
    jobs = planned_jobs(study, config)
    assert jobs.get("build_models") == 1
    assert jobs.get("benchmark") == len(SMOKE["settings"])


def test_new_concurrency_measures_only_new_cells(study):
    config = copy.deepcopy(SMOKE)
    config["benchmark"]["concurrency"] = SMOKE["benchmark"]["concurrency"] + [2]
    assert planned_jobs(study, config).get("benchmark") == len(SMOKE["settings"])
    snakemake(study, config, "--cores", "2", timeout=600)
    new_cells = len(SMOKE["workloads"]) * SMOKE["benchmark"]["repeats"]
    old_cells = len(SMOKE["workloads"]) * len(SMOKE["benchmark"]["concurrency"]) * SMOKE["benchmark"]["repeats"]
    for setting in SMOKE["settings"]:
        log = (results(study) / "logs" / "benchmark" / f"{setting}.log").read_text()
        assert f"{old_cells + new_cells} cells, {old_cells} cached, {new_cells} to measure" in log
        df = pd.read_parquet(results(study) / "requests" / f"{setting}.parquet")
        assert sorted(df.concurrency.unique()) == sorted(config["benchmark"]["concurrency"])
    # back to the original config: the cells of c=2 stay cached, the original cells are reused
    snakemake(study, SMOKE, "--cores", "2", timeout=600)
    assert planned_jobs(study, SMOKE) == {}


def test_interrupted_run_redoes_only_the_incomplete_job(study):
    config = copy.deepcopy(SMOKE)
    config["settings"]["steps3"] = dict(config["settings"]["steps2"], speculative_num_steps=3, speculative_num_draft_tokens=4)
    cfg = study / "interrupted.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        snakemake_argv(study, cfg, "--cores", "2"),
        env=snakemake_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # a terminal's Ctrl-C: SIGINT at its default even when this test runs under a parent that ignores it (a
        # background job of a non-interactive shell does, and every process below would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    cells_dir = results(study) / "cells" / "steps3"
    cells = len(SMOKE["workloads"]) * len(SMOKE["benchmark"]["concurrency"]) * SMOKE["benchmark"]["repeats"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (cells_dir.is_dir() and any(cells_dir.glob("*.parquet"))):
        time.sleep(0.01)  # the rest of a smoke benchmark takes well under a second
    assert cells_dir.is_dir(), "the steps3 benchmark never finished a cell"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=60)
    done_before = len(list(cells_dir.glob("*.parquet")))
    assert done_before < cells, f"Ctrl-C did not stop the benchmark: all {cells} cells were measured"
    out = results(study) / "requests" / "steps3.parquet"
    assert not out.exists(), "an interrupted benchmark left an output that looks complete"
    assert planned_wildcards(study, config, "benchmark") == ["setting=steps3"]
    snakemake(study, config, "--cores", "2", timeout=600)
    log = (results(study) / "logs" / "benchmark" / "steps3.log").read_text()
    assert f"{done_before} cached" in log
    assert out.is_file()


def test_broken_server_fails_its_job_with_the_log_tail_and_spares_the_others(study):
    config = copy.deepcopy(SMOKE)
    config["settings"]["broken"] = {"extra_args": ["--no-such-flag"]}
    proc = snakemake(study, config, "--cores", "2", "--keep-going", check=False, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    log = (results(study) / "logs" / "benchmark" / "broken.log").read_text()
    assert "--no-such-flag" in log and "exited during start-up" in log
    for setting in SMOKE["settings"]:
        assert (results(study) / "requests" / f"{setting}.parquet").is_file()
    assert "benchmark" in out and "broken" in out
