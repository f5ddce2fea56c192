"""The report's time per phase counts the study's current cohorts: the benchmark folder keeps the files of cohorts
an earlier config measured, and summing them overstated a rerun's measuring (62 min for a 15-min run)."""

from __future__ import annotations

from workflow_scripts.analysis.metadata import phase_times


def _bench(folder, name: str, seconds: float) -> None:
    (folder / f"{name}.tsv").write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")


def test_only_the_current_cohorts_count_as_measuring(tmp_path):
    _bench(tmp_path, "build_models", 300.0)
    _bench(tmp_path, "moe_tune_shard_0", 30.0)
    _bench(tmp_path, "moe_tune_shard_1", 31.0)
    _bench(tmp_path, "benchmark_6-settings-vs-baseline-0f81551f", 900.0)  # an earlier config's cohort
    _bench(tmp_path, "benchmark_6-settings-vs-baseline-d5686c6a", 930.0)
    _bench(tmp_path, "benchmark_steps4+steps5-vs-baseline-e3c4204c", 400.0)
    _bench(tmp_path, "analysis_tables", 10.0)
    current = {"6-settings-vs-baseline-d5686c6a", "steps4+steps5-vs-baseline-e3c4204c"}
    assert phase_times(tmp_path, current) == {"model build": 300.0, "MoE tuning": 61.0, "measuring": 1330.0,
                                              "analysis": 10.0}
    assert phase_times(tmp_path)["measuring"] == 2230.0  # without the list, every file counts
