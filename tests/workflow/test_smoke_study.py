"""The real study end to end on config/smoke.yaml: real model build, real servers, real Snakemake; then
partial re-execution after config edits (new cohorts measure only what is new, with a fresh control), an
interrupted run, and a broken server."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from tests.workflow.snakemake_run import REPO, planned_cohorts, planned_jobs, snakemake, snakemake_argv, snakemake_env
from workflow_scripts.analysis.browser_check import check_report
from workflow_scripts.analysis.decisions import DECISION_COLUMNS
from workflow_scripts.analysis.paired import EQUIVALENT, NO_DATA, REAL, WITHIN_NOISE
from workflow_scripts.client.rounds import launch_order
from workflow_scripts.client.cohorts import twin_name
from workflow_scripts.client.plan import cell_sizes

SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
SMOKE_VALIDATED = copy.deepcopy(SMOKE)
validate(SMOKE_VALIDATED, str(REPO / "config" / "schema.yaml"), set_default=True)
SPECULATING = [name for name, s in SMOKE["settings"].items() if s.get("speculative_algorithm")]
CONTROL = SMOKE_VALIDATED["analysis"]["baseline"]
TWIN = twin_name(CONTROL)
MEMBERS = [*SMOKE["settings"], TWIN]
CELLS = len(SMOKE["workloads"]) * len(SMOKE["benchmark"]["concurrency"])
STEPS3 = dict(SMOKE["settings"]["steps2"], speculative_num_steps=3, speculative_num_draft_tokens=4)


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
    (cohort,) = [json.loads(path.read_text()) for path in (res / "benchmark").glob("*.json")]
    assert sorted(cohort["members"]) == sorted(MEMBERS) and cohort["schedule"] == "sliced"
    for member in MEMBERS:
        assert (res / "requests" / f"{member}.parquet").is_file()
        assert (res / "logs" / "server" / cohort["cohort"] / f"{member}.log").stat().st_size > 0
    summary = pd.read_csv(res / "tables" / "summary.csv")
    measured = summary[summary.source == "measured"]
    assert len(measured) == len(SMOKE["settings"]) * CELLS  # the twin is reported apart, in aa.csv
    # the server's cost, measured at the start of the run on the engine the study serves, and in the summary
    served = json.loads((res / "profile" / "served_overhead.json").read_text())
    assert served["ratio"] > 0 and served["engine_torch"] == served["in_process_torch"]
    assert f"ran at {served['ratio']:.2f} of the same engine in-process" in (res / "summary.md").read_text()


def test_step_schedule_deploys_what_the_study_decided(study, monkeypatch):
    """The schedule rule's files: one band row per workload × band, and each workload's settings entry read back
    validates as a setting, builds the server command with the SGLang config it names, and that config routes every
    batch size to its band's steps."""
    from workflow_scripts.engine.adaptive import AdaptiveSpeculativeParams, load_adaptive_config
    from workflow_scripts.launcher.command import ServerSpec, build_command, check_setting

    res = results(study)
    schedule = pd.read_csv(res / "tables" / "step_schedule.csv")
    slots = SMOKE_VALIDATED["server"]["max_running_requests"]
    bands = [b for b, concs in SMOKE_VALIDATED["analysis"]["bands"].items() if concs[0] <= slots]  # none past the server's
    assert len(schedule) == len(SMOKE["workloads"]) * len(bands) and schedule["reason"].str.len().min() > 0
    assert schedule.groupby("workload")["batch_to"].max().eq(slots).all()
    assert (res / "plots" / "step_schedule.svg").stat().st_size > 0
    spec = ServerSpec("embedded", "/m/target", "/m/draft", "127.0.0.1", 8, 0)
    monkeypatch.chdir(study)  # the entry names its config relative to the study's working directory, as Snakemake runs
    for workload, rows in schedule.groupby("workload"):
        (name, setting), = yaml.safe_load((res / "deploy" / workload / "settings.yaml").read_text())["settings"].items()
        check_setting(name, setting)
        if not rows["steps"].any():
            assert not setting.get("speculative_adaptive")  # nothing speculates: a plain setting
            continue
        argv = build_command(spec, setting, port=30000)
        config = argv[argv.index("--speculative-adaptive-config") + 1]
        rule = AdaptiveSpeculativeParams(setting["speculative_num_steps"], load_adaptive_config(config))
        for r in rows.itertuples():
            assert all(rule.steps_for_batch(b) == r.steps for b in range(r.batch_from, r.batch_to + 1))


def test_every_request_accounted_for_and_values_sane(study):
    res = results(study)
    frames = pd.concat(pd.read_parquet(res / "requests" / f"{s}.parquet") for s in MEMBERS)
    cells = frames.groupby(["setting", "workload", "concurrency", "cohort", "repeat"])
    assert cells.ngroups == len(MEMBERS) * CELLS * SMOKE["benchmark"]["repeats"]
    for (setting, workload, c, _, repeat), cell in cells:
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


def test_rounds_interleave_the_settings(study):
    """Within a round, each cell was measured on every member before any member moved on to the next cell."""
    frames = pd.concat(pd.read_parquet(results(study) / "requests" / f"{s}.parquet") for s in MEMBERS)
    starts = frames.groupby(["workload", "concurrency", "repeat", "setting"])["cell_start_ts"].first().reset_index()
    spans = starts.groupby(["workload", "concurrency", "repeat"])["cell_start_ts"].agg(["min", "max"])
    spans = spans.sort_values("min").to_numpy()
    assert all(later_min >= max_ for (_, max_), (later_min, _) in zip(spans, spans[1:]))


def test_aa_control_and_noise_floor(study):
    tables = results(study) / "tables"
    aa = pd.read_csv(tables / "aa.csv")
    assert list(aa.columns) == ["workload", "concurrency", "metric", "diff_pct", "ci_low_pct", "ci_high_pct", "rounds"]
    assert len(aa) == CELLS * 2 and set(aa.metric) == {"aggregate_tok_s", "per_request_tok_s"}
    assert (aa.rounds == SMOKE["benchmark"]["repeats"]).all() and aa.diff_pct.notna().all()
    assert ((aa.ci_low_pct <= aa.diff_pct) & (aa.diff_pct <= aa.ci_high_pct)).all()
    floor = json.loads((tables / "noise_floor.json").read_text())
    assert set(floor) == {"noise_floor_pct", "schedule", "rounds", "launch_position"}
    # the servers started twice, the second time reversed: the start position's effect is fitted on every
    # member but the control (the other settings and the twin) in every cell, and the summary states it
    fitted_on = CELLS * len(SMOKE["settings"])
    assert {e["comparisons"] for e in floor["launch_position"].values()} == {fitted_on}
    assert all(e["ci_low_pct"] <= e["beta_pct"] <= e["ci_high_pct"] for e in floor["launch_position"].values())
    assert "Each position later in the servers' start order" in (results(study) / "summary.md").read_text()
    assert floor["schedule"] == "sliced" and floor["rounds"] == SMOKE["benchmark"]["repeats"]
    assert floor["noise_floor_pct"] == pytest.approx(float(aa.diff_pct.abs().quantile(0.95)))
    improvement = pd.read_csv(tables / "improvement.csv")
    assert set(improvement.verdict) <= {REAL, EQUIVALENT, WITHIN_NOISE, NO_DATA}
    real = improvement[improvement.verdict == REAL]
    assert ((real.ci_low_pct > 0) | (real.ci_high_pct < 0)).all()
    assert (real.improvement_pct.abs() > floor["noise_floor_pct"]).all()
    assert TWIN not in set(improvement.candidate)
    precision = pd.read_csv(tables / "precision.csv")
    assert len(precision) == CELLS and (precision.rounds == SMOKE["benchmark"]["repeats"]).all()


def test_decisions_open_the_summary_and_the_launch_order_is_recorded(study):
    res = results(study)
    decisions = pd.read_csv(res / "tables" / "decisions.csv", keep_default_na=False)
    assert list(decisions.columns) == DECISION_COLUMNS == [
        "workload", "concurrency", "metric", "decision", "best", "runner_up", "lead_pct", "ci_low_pct",
        "ci_high_pct", "rounds", "eliminated", "rounds_needed", "round_s"]
    assert len(decisions) == CELLS * 2 and set(decisions.decision) <= {"winner", "equivalent", "undecided"}
    needed = pd.to_numeric(decisions.rounds_needed, errors="coerce")
    assert needed[decisions.decision != "undecided"].isna().all()
    open_cells = (decisions.decision == "undecided") & needed.notna()
    assert (needed[open_cells] > decisions.rounds[open_cells]).all()
    assert (pd.to_numeric(decisions.round_s) > 0).all()  # every member's cell of the last round, in seconds
    assert (decisions.rounds == SMOKE["benchmark"]["repeats"]).all()
    assert set(decisions.best) <= set(SMOKE["settings"]) and TWIN not in set(decisions.runner_up)
    assert decisions.eliminated.str.fullmatch(r"([A-Za-z0-9_]+@\d+(;[A-Za-z0-9_]+@\d+)*)?").all()
    summary = (res / "summary.md").read_text()
    block = summary.split("## Decisions", 1)[1].split("\n## ", 1)[0]
    assert summary.index("## Decisions") < summary.index("## Headline")
    decided = int((decisions[decisions.metric == "aggregate_tok_s"].decision != "undecided").sum())
    assert f"aggregate tok/s: {decided} of {CELLS} cells decided" in block
    assert "A/A twin ran faster than the control in" in block
    assert ("To decide the rest" in block) == (decisions.decision == "undecided").any()
    (meta,) = [json.loads(path.read_text()) for path in (res / "benchmark").glob("*.json")]
    assert meta["allocation"] == "racing" and meta["seed"] == SMOKE_VALIDATED["benchmark"]["seed"]
    order = launch_order(meta["members"], meta["seed"], meta["cohort"])
    assert meta["launch_order"] == {"0": order, "1": order[::-1]}  # counterbalanced: reversed for round 1
    assert (res / "plots" / "survival.svg").stat().st_size > 0


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


def test_the_readme_commands_read_a_finished_study(study):
    """The README's two commands on a finished study: the A/A goals restate the study's own noise floor, and the
    cost model refitted from the CLI prints the same analysis the study's rule wrote."""
    res = results(study)

    def run(*argv: str) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=snakemake_env())
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout

    floor = json.loads((res / "tables" / "noise_floor.json").read_text())
    goals = run(sys.executable, "-m", "benchmarks.noise_floor", "--study", str(res))
    assert f"noise floor ±{floor['noise_floor_pct']:.2f}%" in goals and "CI includes 0" in goals
    refit = run(sys.executable, "-m", "workflow_scripts.analysis.cost_model", "--study", str(res))
    assert (res / "tables" / "cost_model.md").read_text().strip() in refit


def test_report_renders_in_a_real_browser(study):
    """`snakemake --report` on the real study, opened in headless Chromium: every chart draws marks."""
    report = results(study) / "report.html"
    snakemake(study, SMOKE, "--report", str(report), timeout=300)
    charts = check_report(report, timeout=120)
    assert len(charts) >= 5 and all(chart.marks > 0 for chart in charts)
    summary = (results(study) / "summary.md").read_text()
    assert "ecommend" in summary and "lossless" in summary.lower() and "noise floor" in summary.lower()


def test_rerun_with_nothing_changed_has_nothing_to_do(study):
    assert planned_jobs(study, SMOKE) == {}


def test_model_build_change_reruns_everything_downstream(study):
    config = copy.deepcopy(SMOKE)
    config["model"]["seed"] = 1
    jobs = planned_jobs(study, config)
    assert jobs.get("build_models") == 1 and jobs.get("benchmark") == 1
    (cohort,) = planned_cohorts(study, config)
    assert cohort.startswith(f"{len(MEMBERS) - 1}-settings-vs-{CONTROL}-") or cohort.startswith(
        f"{'+'.join(sorted(set(MEMBERS) - {CONTROL}))}-vs-{CONTROL}-")


def test_new_concurrency_measures_only_new_cells(study):
    config = copy.deepcopy(SMOKE)
    config["benchmark"]["concurrency"] = SMOKE["benchmark"]["concurrency"] + [2]
    (cohort,) = planned_cohorts(study, config)
    # the measurements only: the analysis of the wider grid is not what this test checks
    requests = [str((results(study) / "requests" / f"{setting}.parquet").relative_to(study)) for setting in MEMBERS]
    snakemake(study, config, "--cores", "2", *requests, timeout=600)
    log = (results(study) / "logs" / "benchmark" / f"{cohort}.log").read_text()
    assert f"{len(SMOKE['workloads'])} cells; 0 cached cell-rounds" in log
    for setting in MEMBERS:
        df = pd.read_parquet(results(study) / "requests" / f"{setting}.parquet")
        assert sorted(df.concurrency.unique()) == sorted(config["benchmark"]["concurrency"])
    # back to the original config: nothing is measured, the requests files drop the cells of c=2 again
    assert "benchmark" not in planned_jobs(study, SMOKE)
    snakemake(study, SMOKE, "--cores", "2", timeout=600)
    assert planned_jobs(study, SMOKE) == {}


def test_new_setting_measured_with_a_fresh_control_and_ctrl_c_loses_nothing_finished(study):
    """Adding steps3 plans one new cohort: steps3 and a fresh control, nothing else. Ctrl-C in the middle of a
    round keeps the cells that finished; the rerun completes the same rounds from them."""
    config = copy.deepcopy(SMOKE)
    config["settings"]["steps3"] = STEPS3
    jobs = planned_jobs(study, config)
    assert jobs.get("benchmark") == 1 and "build_models" not in jobs and not any(r.startswith("moe_") for r in jobs)
    (cohort,) = planned_cohorts(study, config)
    assert cohort.startswith(f"steps3-vs-{CONTROL}-")  # the new setting and a fresh control, nothing else
    cfg = study / "interrupted.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        snakemake_argv(study, cfg, "--cores", "2"),
        env=snakemake_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # a terminal's Ctrl-C: SIGINT at its default even when this test runs under a parent that ignores it (a
        # background job of a non-interactive shell does, and every process below would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    cells_dir = results(study) / "cells" / cohort
    total = 2 * CELLS * SMOKE["benchmark"]["repeats"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any(cells_dir.glob("*/*.parquet")):
        time.sleep(0.01)  # the rest of a smoke benchmark takes a few seconds
    assert any(cells_dir.glob("*/*.parquet")), "the steps3 cohort never finished a cell"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=60)
    done_before = len(list(cells_dir.glob("*/*.parquet")))
    assert done_before < total, f"Ctrl-C did not stop the benchmark: all {total} cells were measured"
    out = results(study) / "benchmark" / f"{cohort}.parquet"
    assert not out.exists(), "an interrupted benchmark left an output that looks complete"
    assert list(planned_cohorts(study, config)) == [cohort]
    snakemake(study, config, "--cores", "2", timeout=600)
    log = (results(study) / "logs" / "benchmark" / f"{cohort}.log").read_text()
    assert f"; {done_before} cached cell-rounds;" in log
    assert f"members {CONTROL}, steps3;" in log or f"members steps3, {CONTROL};" in log
    measured = pd.read_parquet(out)
    assert set(measured.setting) == {CONTROL, "steps3"} and measured.groupby(
        ["setting", "workload", "concurrency", "repeat"]).ngroups == total
    improvement = pd.read_csv(results(study) / "tables" / "improvement.csv")
    steps3 = improvement[(improvement.candidate == "steps3") & (improvement.kind == "vs_baseline")]
    assert (steps3.rounds == SMOKE["benchmark"]["repeats"]).all()  # paired with the fresh control's rounds


def test_broken_server_fails_its_job_with_the_log_tail_and_spares_the_others(study):
    config = copy.deepcopy(SMOKE)
    config["settings"]["broken"] = {"extra_args": ["--no-such-flag"]}
    (cohort,) = planned_cohorts(study, config)
    proc = snakemake(study, config, "--cores", "2", "--keep-going", check=False, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    log = (results(study) / "logs" / "benchmark" / f"{cohort}.log").read_text()
    assert "--no-such-flag" in log and "exited during start-up" in log
    for setting in MEMBERS:
        assert (results(study) / "requests" / f"{setting}.parquet").is_file()
    assert "benchmark" in out and cohort in out
