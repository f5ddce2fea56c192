"""Resource declarations and the pre-submission checks of rules/scaleout.smk, through real Snakemake dry runs (no
cluster needed: the checks run at parse time), plus the parsing helpers they rest on."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from tests.workflow.snakemake_run import REPO, snakemake
from workflow_scripts.scaleout.checks import ScaleoutError, gres_gpus, setting_gpus

SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def sglang_config() -> dict:
    """A study on SGLang with tensor parallelism 2, and one setting that runs on 4 GPUs through its extra_args.
    A dry run reads none of the paths."""
    config = copy.deepcopy(SMOKE)
    config["engine"] = "sglang"
    config["sglang"] = {
        "model_path": "/models/target",
        "draft_path": "/models/draft",
        "tp_size": 2,
        "checkout": "/src/sglang",
    }
    config["settings"] = {
        "baseline": {"moe_config": "tuned"},
        "steps2": SMOKE["settings"]["steps2"],
        "wide": {"extra_args": ["--tp-size", "4"]},
    }
    return config


def dry_run(tmp_path, config, *args, check=True):
    return snakemake(tmp_path, config, "-n", *args, check=check, timeout=120)


def job_resources(out: str, rule: str) -> dict[str, dict[str, str]]:
    """{wildcards: {resource: value}} of the planned jobs of `rule` in a dry run's printout."""
    found = {}
    for block in re.split(r"\n(?=\[.*\]\n)", out):
        if not re.search(rf"^(local)?rule {rule}:", block, re.M):
            continue
        wildcards = re.search(r"wildcards: (.*)", block)
        resources = re.search(r"resources: (.*)", block)
        found[wildcards.group(1) if wildcards else ""] = dict(
            item.split("=", 1) for item in resources.group(1).split(", ") if "=" in item
        )
    return found


def test_default_profile_is_picked_up_without_flags(tmp_path):
    proc = dry_run(tmp_path, SMOKE)
    out = proc.stdout + proc.stderr
    assert re.search(r"Using workflow specific profile \S*profiles/default", out)
    # cores: 4 from the profile: the benchmark uses every core it is given
    assert re.search(r"rule benchmark:(?:\n    .*)*\n    threads: 4", out)


def test_every_rule_declares_gpu_mem_and_runtime(tmp_path):
    out = dry_run(tmp_path, SMOKE, "--cores", "2").stdout
    rules = set(re.findall(r"^(?:local)?rule (\w+):", out, re.M)) - {"all"}
    assert {"build_models", "benchmark", "moe_tune_shard", "analysis_tables"} <= rules
    for rule in rules:
        for wildcards, resources in job_resources(out, rule).items():
            assert {"gpu", "mem_mb", "runtime"} <= set(resources), (rule, wildcards, resources)
            assert resources["gpu"] == "0", (rule, wildcards)  # the embedded engine runs on CPUs


@pytest.mark.parametrize("schedule, node_gpus, gpus", [
    ("auto", None, "4"),  # one server at a time: the widest setting's 4 GPUs
    ("blocked", 16, "4"),
    ("auto", 16, "10"),  # every server at once: 2 + 2 + 4 + the twin's 2
    ("interleaved", 10, "10"),
])
def test_sglang_cohorts_ask_for_the_gpus_they_use(tmp_path, schedule, node_gpus, gpus):
    config = sglang_config()
    config["sglang"]["node_gpus"] = node_gpus
    config["benchmark"]["schedule"] = schedule
    out = dry_run(tmp_path, config, "--cores", "2").stdout
    assert [res["gpu"] for res in job_resources(out, "benchmark").values()] == [gpus]
    shards = job_resources(out, "moe_tune_shard")
    assert len(shards) == SMOKE["moe"]["shards"] and {res["gpu"] for res in shards.values()} == {"1"}
    assert {res["gpu"] for res in job_resources(out, "moe_merge").values()} == {"0"}


@pytest.mark.parametrize(
    "engine, args, message",
    [
        (
            "embedded",
            ["--set-resources", "benchmark:gpu=1"],
            "set-resources benchmark: asks for 1 GPU(s), more than cohort '",
        ),
        (
            "sglang",
            ["--set-resources", "benchmark:gpu=8"],
            "set-resources benchmark: asks for 8 GPU(s), more than cohort '",
        ),
        (
            "sglang",
            ["--set-resources", "benchmark:gres='gpu:2'"],
            "set-resources benchmark: gres asks for GPUs and the rule's own gpu resource asks again (--gpus)",
        ),
        (
            "sglang",
            ["--set-resources", "benchmark:gres='gpu:a100:8'", "benchmark:gpu=0"],
            "set-resources benchmark: asks for 8 GPU(s), more than cohort '",
        ),
        (
            "sglang",
            ["--set-resources", "moe_tune_shard:gpu=2"],
            "set-resources moe_tune_shard: asks for 2 GPU(s), more than a tuning shard uses (1: one GPU per tuning shard)",
        ),
        (
            "sglang",
            ["--default-resources", "gres='gpu:1'"],
            "default-resources: asks every job for 1 GPU(s), but the model build and the analysis use none",
        ),
        ("embedded", ["--default-resources", "slurm_partition=''"], "slurm_partition is '', not a partition"),
    ],
)
def test_bad_cluster_requests_are_refused_before_any_job(tmp_path, engine, args, message):
    config = SMOKE if engine == "embedded" else sglang_config()
    proc = dry_run(tmp_path, config, "--cores", "2", *args, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert message in out, out[-3000:]
    assert "Job stats" not in out


@pytest.mark.parametrize(
    "overrides, shown",
    [(["benchmark:gpu=2"], {"gpu": "2"}), (["benchmark:gres='gpu:h100:2'", "benchmark:gpu=0"], {"gres": "gpu:h100:2"})],
)
def test_a_request_that_matches_every_cohort_passes(tmp_path, overrides, shown):
    config = sglang_config()
    del config["settings"]["wide"]  # one server at a time (no sglang.node_gpus): 2 GPUs
    out = dry_run(tmp_path, config, "--cores", "2", "--set-resources", *overrides).stdout
    for resources in job_resources(out, "benchmark").values():
        assert {key: resources.get(key) for key in shown} == shown


def test_setting_gpus_reads_the_servers_parallel_flags():
    assert setting_gpus("s", {}, "embedded", 4) == 0
    assert setting_gpus("s", {}, "sglang", 4) == 4
    assert setting_gpus("s", {"extra_args": ["--tp", "8"]}, "sglang", 4) == 8
    assert setting_gpus("s", {"extra_args": ["--tensor-parallel-size=2", "--dp-size", "2"]}, "sglang", 1) == 4
    assert setting_gpus("s", {"extra_args": ["--tp-size", "4", "--dp", "2", "--enable-dp-attention"]}, "sglang", 1) == 4
    with pytest.raises(ScaleoutError, match=r"settings\.s\.extra_args: --tensor-parallel-size 'two'"):
        setting_gpus("s", {"extra_args": ["--tp-size", "two"]}, "sglang", 1)


def test_gres_gpus_counts_only_gpus():
    assert gres_gpus("gpu") == 1
    assert gres_gpus("gpu:2") == 2
    assert gres_gpus("gpu:h100:4") == 4
    assert gres_gpus("gpu:h100:4,shard:2") == 4
    assert gres_gpus("tmpfs:10G") == 0
