"""All tables built from a small study with known speedups, through the real CLIs and files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.analysis.request_data import cell, study_rows, write_parquet
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summary import lossless_lines
from workflow_scripts.analysis.tables import build

REPO = Path(__file__).resolve().parents[2]
SPEC = {"speculative_algorithm": "STANDALONE", "speculative_eagle_topk": 1}
CONFIG = {
    "settings": {"baseline": {}, "same": {"moe_config": "default"},
                 "steps1": {**SPEC, "speculative_num_steps": 1}, "steps2": {**SPEC, "speculative_num_steps": 2},
                 "steps3": {**SPEC, "speculative_num_steps": 3}},
    "workloads": {"synthetic": {"kind": "synthetic", "temperature": 0.0},
                  "realistic": {"kind": "realistic", "temperature": 0.7}},
    "analysis": {"bootstrap": {"resamples": 300}, "bands": {"low": [1], "mid": [4]},
                 "external": [{"path": str(REPO / "tests/data/article.csv"), "label": "article"}]},
}
SPEEDUPS = {"baseline": {"synthetic": 1.0, "realistic": 1.0}, "same": {"synthetic": 1.0, "realistic": 1.0},
            "steps1": {"synthetic": 1.5, "realistic": 1.1}, "steps2": {"synthetic": 1.8, "realistic": 1.05}}


@pytest.fixture(scope="module")
def request_files(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("requests")
    rows = study_rows(SPEEDUPS)
    # steps3: every request of its synthetic cells failed
    rows += cell("steps3", "synthetic", 1, 0, n=3, error="boom") + cell("steps3", "synthetic", 4, 0, n=3, error="boom")
    return [write_parquet([r for r in rows if r["setting"] == s], root / f"{s}.parquet")
            for s in [*SPEEDUPS, "steps3"]]


@pytest.fixture(scope="module")
def tables(request_files):
    return build(StudyConfig.from_dict(CONFIG), request_files)


def _one(frame: pd.DataFrame, **where) -> pd.Series:
    sel = frame
    for key, value in where.items():
        sel = sel[sel[key] == value]
    assert len(sel) == 1, where
    return sel.iloc[0]


def test_summary_medians_and_counts(tables):
    s = tables.summary
    base = _one(s, source="measured", setting="baseline", workload="synthetic", concurrency=1)
    # repeats run at 0.98, 1.00, 1.02 × 100/1.1 tok/s
    assert base["per_request_tok_s_median"] == pytest.approx(100 / 1.1)
    assert base["per_request_tok_s_ci_low"] < base["per_request_tok_s_median"] < base["per_request_tok_s_ci_high"]
    assert (base["n_repeats"], base["n_ok"], base["n_err"]) == (3, 6, 0)
    assert base["eos_share"] == 0.0
    assert _one(s, source="measured", setting="baseline", workload="realistic", concurrency=1)["eos_share"] == 1.0
    article = _one(s, source="article", setting="steps2", workload="synthetic", concurrency=64)
    assert article["per_request_tok_s_median"] == 99 and article["aggregate_tok_s_median"] == 1844


def test_empty_cells_stay_empty_in_summary_improvement_and_article_table(tables):
    empty = _one(tables.summary, source="measured", setting="steps3", workload="synthetic", concurrency=4)
    assert empty["n_ok"] == 0 and empty["n_err"] == 3
    assert math.isnan(empty["per_request_tok_s_median"]) and math.isnan(empty["aggregate_tok_s_median"])
    imp = _one(tables.improvement, source="measured", kind="vs_baseline", candidate="steps3", workload="synthetic",
               concurrency=4, metric="per_request_tok_s")
    assert math.isnan(imp["improvement_pct"])
    heading, table = next((h, t) for h, t in tables.articles
                          if h == "synthetic: per-request tok/s (source: measured)")
    row = table[table["C"] == 4].iloc[0]
    assert row["steps3 tok/s"] == "—" and row["steps3 vs baseline"] == "—"
    assert "0" not in row["steps3 tok/s"]


def test_improvements_with_ci_and_noise_flag(tables):
    imp = tables.improvement
    s1 = _one(imp, source="measured", kind="vs_baseline", candidate="steps1", workload="synthetic", concurrency=4,
              metric="per_request_tok_s")
    assert s1["improvement_pct"] == pytest.approx(50.0)
    assert s1["ci_low_pct"] <= 50.0 <= s1["ci_high_pct"] and s1["within_noise"] == False  # noqa: E712
    same = _one(imp, source="measured", kind="vs_baseline", candidate="same", workload="synthetic", concurrency=1,
                metric="per_request_tok_s")
    assert same["improvement_pct"] == pytest.approx(0.0, abs=1e-9) and same["within_noise"] == True  # noqa: E712
    pair = _one(imp, source="measured", kind="pairwise", baseline="steps1", candidate="steps2", workload="synthetic",
                concurrency=1, metric="per_request_tok_s")
    assert pair["improvement_pct"] == pytest.approx(20.0)
    article = _one(imp, source="article", kind="pairwise", candidate="steps2", concurrency=1, metric="per_request_tok_s")
    assert round(article["improvement_pct"]) == 51 and article["within_noise"] is None
    # auto pairs: steps N-1 -> N among otherwise identical settings, never the non-speculative ones
    assert set(zip(imp.loc[imp["kind"] == "pairwise", "baseline"], imp.loc[imp["kind"] == "pairwise", "candidate"])) \
        == {("steps1", "steps2"), ("steps2", "steps3")}


def test_gap_and_recommendation(tables):
    gap = _one(tables.gap, source="measured", setting="steps1", concurrency=1, metric="per_request_tok_s")
    assert gap["synthetic_improvement_pct"] == pytest.approx(50.0)
    assert gap["realistic_improvement_pct"] == pytest.approx(10.0)
    assert gap["overstatement_pp"] == pytest.approx(40.0)
    assert "overstates" in tables.gap_sentence and "steps2 at concurrency" in tables.gap_sentence
    rec = tables.recommendation.set_index(["band", "workload", "metric"])
    assert rec.loc[("low", "synthetic", "per_request_tok_s"), "recommended"] == "steps2"
    assert rec.loc[("low", "realistic", "per_request_tok_s"), "recommended"] == "steps1"
    assert "steps3 (errored)" in rec.loc[("low", "synthetic", "per_request_tok_s"), "excluded"]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"workflow_scripts.analysis.{module}", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_cli_writes_tables_plots_and_summary(request_files, tmp_path: Path):
    cfg = json.dumps(CONFIG)
    out = tmp_path / "tables"
    proc = _run("tables", "--config-json", cfg, "--requests", *map(str, request_files), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(out / "summary.csv")
    for col in ["source", "setting", "workload", "concurrency", "n_ok", "n_err", "per_request_tok_s_median",
                "per_request_tok_s_ci_low", "per_request_tok_s_ci_high", "aggregate_tok_s_median",
                "aggregate_tok_s_ci_low", "aggregate_tok_s_ci_high", "ttft_p50_ms", "tpot_p50_ms",
                "accept_length_mean"]:
        assert col in summary.columns, col
    assert "+51%" in (out / "article_tables.md").read_text()
    assert "—" in (out / "summary.html").read_text()
    proc = _run("plots", "--tables-dir", str(out), "--out-dir", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    svg = (tmp_path / "plots" / "throughput.svg").read_text()
    assert svg.startswith("<svg") and "steps3: no ok request" in svg
    html = (tmp_path / "plots" / "speedup.html").read_text()
    assert "cdn.jsdelivr" not in html  # vega is inlined: the chart renders offline
    proc = _run("summary", "--config-json", cfg, "--study", "unit", "--tables-dir", str(out),
                "--out", str(tmp_path / "summary.md"), "--html", str(tmp_path / "summary.html"))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "summary.md").read_text()
    for section in ("## Headline", "## Recommendation", "## Synthetic vs realistic workload",
                    "## Lossless check (temperature 0)", "## Against external results", "## The article's tables"):
        assert section in text
    assert "`steps3` synthetic C=1" in text and "overstates" in text
    assert "+51%" in proc.stdout  # the article tables close the run's output
    assert "Server cost" not in text  # no profile/served_overhead.json beside tables/: an SGLang or external study
    served = {"ratio": 0.5, "warn_below": 0.8, "served_tok_s": 100.0, "in_process_tok_s": 200.0, "rounds": 5,
              "engine_torch": {"num_threads": 1}}
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "served_overhead.json").write_text(json.dumps(served))
    proc = _run("summary", "--config-json", cfg, "--study", "unit", "--tables-dir", str(out),
                "--out", str(tmp_path / "summary.md"), "--html", str(tmp_path / "summary.html"))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "summary.md").read_text()
    assert "ran at 0.50 of the same engine in-process" in text and "⚠ below 0.80" in text


def test_bad_external_csv_fails_cleanly_and_writes_nothing(request_files, tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("setting,workload,concurrency,per_request_tok_s,aggregate_tok_s\nsteps1,synthetic,1,10,20\n"
                   "nosuch,synthetic,1,10,20\n")
    cfg = {**CONFIG, "analysis": {**CONFIG["analysis"], "external": [{"path": str(bad), "label": "x"}]}}
    out = tmp_path / "tables"
    proc = _run("tables", "--config-json", json.dumps(cfg), "--requests", *map(str, request_files),
                "--out-dir", str(out))
    assert proc.returncode == 2
    assert f"{bad}: row 3, column setting: unknown setting 'nosuch'" in proc.stderr
    assert not out.exists()


def test_lossless_call_out_in_summary():
    table = pd.DataFrame({"setting": ["baseline", "steps1"], "workload": ["synthetic"] * 2, "concurrency": [1, 1],
                          "n_compared": [8, 8], "n_identical": [8, 7], "share_identical": [1.0, 0.875],
                          "n_no_reference": [0, 0]})
    lines = lossless_lines(table, "baseline")
    assert "⚠" not in lines[0] and "⚠ under 100%" in lines[1] and "7/8" in lines[1]
