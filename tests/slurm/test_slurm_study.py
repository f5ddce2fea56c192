"""The smoke study through `--executor slurm` on a real one-node Slurm cluster (tests/slurm/conftest.py).

One module-scoped study, shaped like a user's day: a run where one setting's server cannot start (a bad flag), which
fails its cohort (the settings measured together in rounds) with a clear message; then the flag is fixed and the rerun
measures the old cohort without that setting and a new cohort of it with a fresh control, and nothing else is rebuilt.
The results are compared with a local run of the same config.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.slurm.site_profile import write_site_profile
from tests.workflow.snakemake_run import REPO, planned_cohorts, snakemake
from workflow_scripts.client.plan import cell_sizes
from workflow_scripts.scaleout.local_slurm import LocalSlurm

SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
BAD_FLAG = "--no-such-flag"


def study_config(broken: bool) -> dict:
    """The smoke study cut to what a Slurm round trip needs to show: 3 settings (and the baseline's twin), 1 workload,
    2 concurrency levels, 1 round, the engine's default MoE config. `steps2` carries a flag its server refuses when `broken`."""
    config = copy.deepcopy(SMOKE)
    settings = {name: dict(config["settings"][name], moe_config="default") for name in ("baseline", "steps1", "steps2")}
    settings["steps2"]["extra_args"] = [BAD_FLAG] if broken else []
    config["settings"] = settings
    config["workloads"] = {"synthetic": config["workloads"]["synthetic"]}
    config["benchmark"] = dict(config["benchmark"], repeats=1, max_repeats=1)
    config["moe"] = dict(config["moe"], tune=False)
    return config


@dataclass
class SlurmStudy:
    workdir: Path
    failed: subprocess.CompletedProcess
    failed_cohort: str
    fixed: subprocess.CompletedProcess
    local: Path


def submitted(proc: subprocess.CompletedProcess) -> list[str]:
    """Slurm job ids that Snakemake reported as submitted, in order."""
    return re.findall(r"has been submitted with SLURM jobid (\d+)", proc.stdout + proc.stderr)


def job_comments(cluster: LocalSlurm, job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (comment, state)}; the plugin's comment is rule_<rule>[_wildcards_<values>]. squeue keeps finished
    jobs for the test cluster's MinJobAge (30 min), longer than this module runs."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i|%k|%T", "-j", ",".join(job_ids)],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.strip().splitlines()]
    return {job: (comment.strip(), state) for job, comment, state in rows}


@contextmanager
def on_cluster(cluster: LocalSlurm):
    """Snakemake, and the jobs it submits, reach the test cluster through PATH and SLURM_CONF (tests/workflow's
    snakemake() passes os.environ on)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in ("PATH", "SLURM_CONF"):
            mp.setenv(key, cluster.env()[key])
        yield


def results(workdir: Path) -> Path:
    return workdir / "results" / SMOKE["study"]


@pytest.fixture(scope="module")
def slurm_study(slurm_cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory) -> SlurmStudy:
    workdir = tmp_path_factory.mktemp("slurm-study")
    profile = str(write_site_profile(workdir / "profile"))
    with on_cluster(slurm_cluster):
        (failed_cohort,) = planned_cohorts(workdir, study_config(broken=True))
        # the measurements first, as a user does before the rest of the study: the model pair, then the cohort
        # whose server refuses the flag (the rerun builds the rest, so every rule still goes through Slurm)
        cohort_out = f"results/{SMOKE['study']}/benchmark/{failed_cohort}.parquet"
        failed = snakemake(
            workdir, study_config(broken=True), "--workflow-profile", profile, cohort_out, check=False, timeout=360
        )
        # the same config on this machine, reusing the built model pair so that only the measurements are redone;
        # it runs beside the Slurm rerun, which mostly waits between its status checks
        local = tmp_path_factory.mktemp("local-study")
        results(local).mkdir(parents=True)
        shutil.copytree(results(workdir) / "models", results(local) / "models")
        with ThreadPoolExecutor(max_workers=1) as pool:
            local_run = pool.submit(snakemake, local, study_config(broken=False), "--cores", "2", timeout=300)
            fixed = snakemake(workdir, study_config(broken=False), "--workflow-profile", profile, timeout=300)
            local_run.result()
    return SlurmStudy(workdir, failed, failed_cohort, fixed, local)


def benchmark_comments(comments) -> list[str]:
    return sorted(comment for comment, _ in comments if comment.startswith("rule_benchmark"))


def test_jobs_went_through_slurm(slurm_study, slurm_cluster):
    jobs = submitted(slurm_study.failed) + submitted(slurm_study.fixed)
    comments = job_comments(slurm_cluster, jobs)
    assert set(comments) == set(jobs), "Snakemake reported jobs that Slurm does not know"
    rules = {comment for comment, _ in comments.values()}
    assert {
        "rule_build_models",
        f"rule_benchmark_wildcards_{slurm_study.failed_cohort}",
        "rule_analysis_tables",
        "rule_analysis_plots",
        "rule_analysis_summary",
        "rule_study_metadata",
    } <= rules
    # a log per job under the plugin's log dir names the Slurm job id
    assert f"slurm_logs/rule_build_models/{jobs[0]}.log" in slurm_study.failed.stdout + slurm_study.failed.stderr


def test_benchmarks_keep_a_node_to_themselves(slurm_study, slurm_cluster):
    jobs = submitted(slurm_study.failed) + submitted(slurm_study.fixed)
    for job, (comment, _) in job_comments(slurm_cluster, jobs).items():
        shown = subprocess.run(
            ["scontrol", "show", "job", job], env=slurm_cluster.env(), capture_output=True, text=True, check=True
        ).stdout
        exclusive = "OverSubscribe=NO" in shown
        assert exclusive == comment.startswith("rule_benchmark"), (comment, shown)


def test_failed_job_fails_the_run_with_a_clear_message(slurm_study, slurm_cluster):
    proc = slurm_study.failed
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error in rule benchmark" in out and f"cohort={slurm_study.failed_cohort}" in out
    jobs = job_comments(slurm_cluster, submitted(proc))
    failed = {job: comment for job, (comment, state) in jobs.items() if state == "FAILED"}
    # the profile retries once: both attempts are Slurm jobs of the cohort, and the message names the Slurm job
    assert sorted(failed.values()) == [f"rule_benchmark_wildcards_{slurm_study.failed_cohort}"] * 2
    assert f"SLURM-job '{max(failed, key=int)}' failed" in out
    # --show-failed-logs: the job's log, with the server's refusal, is in the run's own output
    assert "server exited during start-up" in out and BAD_FLAG in out


def test_rerun_measures_the_old_cohort_without_the_fixed_setting_and_a_new_one_with_it(slurm_study, slurm_cluster):
    comments = job_comments(slurm_cluster, submitted(slurm_study.fixed)).values()
    rules = [comment for comment, _ in comments]
    assert "rule_build_models" not in rules and "rule_analysis_tables" in rules
    benchmarks = benchmark_comments(comments)
    assert len(benchmarks) == 2 and f"rule_benchmark_wildcards_{slurm_study.failed_cohort}" in benchmarks
    metas = {p.stem: json.loads(p.read_text()) for p in (results(slurm_study.workdir) / "benchmark").glob("*.json")}
    old = metas.pop(slurm_study.failed_cohort)
    (new,) = metas.values()
    assert "steps2" not in old["members"] and sorted(new["members"]) == ["baseline", "steps2"]


def test_same_cells_as_a_local_run_and_no_lost_requests(slurm_study):
    config = study_config(broken=False)
    keys = ["setting", "workload", "concurrency", "cohort", "repeat"]
    frames = {}
    for name, workdir in (("slurm", slurm_study.workdir), ("local", slurm_study.local)):
        frames[name] = pd.concat(pd.read_parquet(p) for p in sorted((results(workdir) / "requests").glob("*.parquet")))
    on_slurm, local = frames["slurm"], frames["local"]
    assert list(on_slurm.columns) == list(local.columns)
    cells = ["setting", "workload", "concurrency"]
    assert sorted(on_slurm.groupby(cells).groups) == sorted(local.groupby(cells).groups)
    members = len(config["settings"]) + 1  # and the A/A twin
    assert len(local.groupby(keys)) == members * len(config["workloads"]) * len(config["benchmark"]["concurrency"])
    for (setting, workload, concurrency, _, repeat), cell in on_slurm.groupby(keys):
        warmup, measured = cell_sizes(config, concurrency)
        assert len(cell) == warmup + measured, (setting, workload, concurrency, repeat)
    assert on_slurm.error.isna().all(), on_slurm.error.dropna().head().tolist()
    summaries = {
        name: pd.read_csv(results(w) / "tables" / "summary.csv")
        for name, w in (("slurm", slurm_study.workdir), ("local", slurm_study.local))
    }
    assert list(summaries["slurm"].columns) == list(summaries["local"].columns)
    rows = ["source", "setting", "workload", "concurrency"]
    assert (
        summaries["slurm"][rows].sort_values(rows).values.tolist()
        == summaries["local"][rows].sort_values(rows).values.tolist()
    )


def test_submission_error_from_slurm_reaches_the_user_verbatim(slurm_cluster, tmp_path):
    profile = str(write_site_profile(tmp_path / "profile", partition="nosuchpartition"))
    with on_cluster(slurm_cluster):
        proc = snakemake(tmp_path, study_config(broken=False), "--workflow-profile", profile, check=False, timeout=120)
    assert proc.returncode != 0
    assert "sbatch: error: invalid partition specified: nosuchpartition" in proc.stdout + proc.stderr


def test_placeholder_partition_is_refused_before_submission(slurm_cluster, tmp_path):
    def job_count() -> int:
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%i"],
            env=slurm_cluster.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return len(out.split())

    before = job_count()
    with on_cluster(slurm_cluster):
        proc = snakemake(
            tmp_path,
            study_config(broken=False),
            "--workflow-profile",
            str(REPO / "profiles" / "slurm"),
            check=False,
            timeout=120,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "slurm_partition is '<your-partition>'" in out and "profiles/slurm/config.yaml" in out
    assert "submitted with SLURM jobid" not in out
    assert job_count() == before
