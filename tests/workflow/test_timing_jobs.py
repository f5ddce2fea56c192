"""Jobs that time something never share the machine: each takes the single `benchmark_slot`.

`threads: node_cores()` alone does not keep them apart once --cores exceeds the machine's cores (the default
profile asks for 4 on 2-core machines): a default-config benchmark then ran beside the MoE tuning shards and
measured 19% slow, consistently, against an identical setting measured alone.
"""

import yaml

from tests.workflow.snakemake_run import REPO, planned_jobs_fields

TIMING_RULES = {"benchmark", "moe_tune_shard", "moe_roofline", "forward_profile", "served_overhead"}


def test_every_timing_job_takes_the_one_benchmark_slot(tmp_path):
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    jobs = planned_jobs_fields(tmp_path, config, "resources")
    timing = [(rule, res) for rule, res in jobs if rule in TIMING_RULES]
    assert {rule for rule, _ in timing} == TIMING_RULES, jobs
    assert all("benchmark_slot=1" in res for _, res in timing), timing
    others = [(rule, res) for rule, res in jobs if rule not in TIMING_RULES]
    assert others and not any("benchmark_slot=1" in res for _, res in others), others
    profile = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert profile["resources"]["benchmark_slot"] == 1
