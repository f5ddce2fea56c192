"""The real Snakemake report, rendered in headless Chromium: charts must draw, and a broken one must fail.

Needs Debian's chromium (`make system-deps` installs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.analysis.request_data import cell, study_rows, write_parquet
from workflow_scripts.analysis.browser_check import BrowserCheckError, check_report
from workflow_scripts.analysis.rule_items import PLOT_NAMES
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.tables import build
from workflow_scripts.redaction import REDACTED

REPO = Path(__file__).resolve().parents[2]
SPEC = {"speculative_algorithm": "STANDALONE", "speculative_eagle_topk": 1}
CONFIG = {
    "settings": {"baseline": {}, "steps1": {**SPEC, "speculative_num_steps": 1},
                 "steps2": {**SPEC, "speculative_num_steps": 2}},
    "workloads": {"synthetic": {"kind": "synthetic", "temperature": 0.0},
                  "realistic": {"kind": "realistic", "temperature": 0.7}},
    "analysis": {"baseline": "baseline", "pairwise": "auto", "bootstrap": {"resamples": 200, "ci": 0.95, "seed": 0},
                 "bands": {"low": [1], "mid": [4]}, "tie_tolerance": 0.01,
                 "external": [{"path": str(REPO / "tests/data/article.csv"), "label": "article"}]},
}
SECRET = "hf_tok3n-that-must-never-be-published"
SPEEDUPS = {"baseline": {"synthetic": 1.0, "realistic": 1.0}, "steps1": {"synthetic": 1.5, "realistic": 1.1},
            "steps2": {"synthetic": 1.8, "realistic": 1.05}}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-d", str(workdir), "-s", str(workdir / "Snakefile"),
                           *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"snakemake {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _write_tables(workdir: Path) -> None:
    rows = study_rows(SPEEDUPS, repeats=2)
    paths = [write_parquet([r for r in rows if r["setting"] == s], workdir / "req" / f"{s}.parquet") for s in SPEEDUPS]
    build(StudyConfig.from_dict(CONFIG), paths).write(workdir / "tables")


def test_one_plot_in_a_tiny_snakefile_draws_in_the_browser(tmp_path: Path):
    _write_tables(tmp_path)
    (tmp_path / "caption.rst").write_text("Throughput against concurrency.\n")
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "plots/throughput.svg"\n\n'
        "rule plot:\n"
        '    input: "tables/summary.csv", "tables/improvement.csv", "tables/latency_quantiles.csv"\n'
        "    output:\n"
        '        svg=report("plots/throughput.svg", caption="caption.rst", category="Plots"),\n'
        '        html=report("plots/throughput.html", caption="caption.rst", category="Plots"),\n'
        '    log: "logs/plot.log"\n'
        '    shell: "python -m workflow_scripts.analysis.plots --tables-dir tables --out-dir plots'
        ' --only throughput > {log} 2>&1"\n')
    snakemake(tmp_path, "--cores", "1")
    snakemake(tmp_path, "--report", "report.html")
    results = {Path(r.path).name: r for r in check_report(tmp_path / "report.html", tmp_path / "shots", timeout=60)}
    assert set(results) == {"throughput.svg", "throughput.html"}
    # the same chart drawn by two renderers (vl-convert's SVG, vega-embed in the page) has the same marks
    assert results["throughput.svg"].marks == results["throughput.html"].marks > 10
    assert all(Path(r.screenshot).stat().st_size > 10_000 for r in results.values())


def test_chart_that_cannot_load_its_javascript_fails_the_check(tmp_path: Path):
    # altair's default HTML fetches vega from a CDN; offline, nothing draws, and the check must say so
    (tmp_path / "caption.rst").write_text("A chart whose JS is not inlined.\n")
    (tmp_path / "Snakefile").write_text(
        "import altair as alt, pandas as pd\n\n"
        "rule cdn:\n"
        '    output: report("plots/cdn.html", caption="caption.rst", category="Plots")\n'
        "    run:\n"
        "        chart = alt.Chart(pd.DataFrame({'x': [1, 2], 'y': [3, 4]})).mark_line().encode(x='x', y='y')\n"
        "        open(output[0], 'w').write(chart.to_html())\n")
    snakemake(tmp_path, "--cores", "1")
    snakemake(tmp_path, "--report", "report.html")
    with pytest.raises(BrowserCheckError, match="plots/cdn.html: the interactive chart drew no marks"):
        check_report(tmp_path / "report.html", timeout=8)


def test_analysis_rules_end_to_end_with_report_html_and_zip(tmp_path: Path):
    """rules/analysis.smk on generated requests (with an all-errored cell and the article as external)."""
    results = tmp_path / "results" / "e2e"
    rows = study_rows(SPEEDUPS, repeats=2) + cell("steps2", "realistic", 4, 0, n=2, error="boom")
    for s in SPEEDUPS:
        write_parquet([r for r in rows if r["setting"] == s], results / "requests" / f"{s}.parquet")
    build_info = {"preset": "smoke", "seed": 0, "params": 1234}
    (results / "models" / "target").mkdir(parents=True)
    (results / "models" / "target" / "build_info.json").write_text(json.dumps(build_info))
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "study": "e2e", "engine": "embedded",
                                                      "benchmark": {"aa_control": False, "precision_pct": 3,
                                                                    "equivalence_pct": 4, "repeats": 2},
                                                      "server": {"env": {"HF_TOKEN": SECRET, "OMP_PROC_BIND": "1"}}}))
    (tmp_path / "Snakefile").write_text(
        # what rules/common.smk provides, for a workflow that only has the analysis
        'configfile: "config.json"\n'
        'STUDY = config["study"]\nRESULTS = f"results/{STUDY}"\n'
        'ENGINE = config["engine"]\n'
        # the requests files are given; no cohort meta, no A/A twin
        'COVERAGE = {name: [] for name in config["settings"]}\nCOHORT_BY_ID = {}\n'
        # no forward profile of the engine: the cost model's step cost stays linear in the drafts
        'PROFILE = None\nPROFILED = False\n'
        # no served-overhead measurement (rules/profile.smk): the summary prints no server-cost line
        'SERVED_OVERHEAD = []\n\n'
        f'report: "{REPO}/report/workflow.rst"\n'
        f'include: "{REPO}/rules/analysis.smk"\n\n'
        "rule all:\n    input: analysis_outputs()\n")
    proc = snakemake(tmp_path, "--cores", "2")
    assert "+51%" in proc.stdout  # the article tables are printed
    for path in ["tables/summary.csv", "tables/article_tables.md", "plots/pareto.svg", "plots/latency.html",
                 "summary.md", "summary.html", "metadata/study.json"]:
        assert (results / path).stat().st_size > 0, path
    meta = json.loads((results / "metadata" / "study.json").read_text())
    assert meta["packages"]["pandas"] and meta["hardware"]["logical_cores"] >= 1 and meta["git"]["commit"]
    assert meta["model_build_info"] == build_info and meta["config"]["study"] == "e2e"
    assert meta["config"]["server"]["env"] == {"HF_TOKEN": REDACTED, "OMP_PROC_BIND": REDACTED}  # keys only
    assert "cell(s) have no successful request" in (results / "summary.md").read_text()
    # records without spec_correct_drafts_histogram and an external CSV without accept_length: the cost model says
    # why it is skipped, in one line each, and the analysis goes on
    summary_md = (results / "summary.md").read_text()
    assert "- Cost model, measured: skipped: no usable spec_correct_drafts_histogram" in summary_md
    assert "- Cost model, article: skipped: no accept_length column, so no acceptance to fit." in summary_md
    snakemake(tmp_path, "--report", str(results / "report.html"))
    assert "Start with" in (results / "report.html").read_text()  # the landing page text
    snakemake(tmp_path, "--report", str(results / "report.zip"))
    _assert_secret_unpublished(results, SECRET)
    for report in ("report.html", "report.zip"):
        checked = check_report(results / report, timeout=60)
        assert len(checked) == 2 * len(PLOT_NAMES) and all(r.marks > 0 for r in checked), report


def _assert_secret_unpublished(results: Path, secret: str) -> None:
    """The token is in the config file but in nothing published: not in any file under results/ (metadata, summary,
    tables, logs, report.html), nor in any member of report.zip."""
    published = {p: p.read_bytes() for p in results.rglob("*") if p.is_file() and p.suffix != ".zip"}
    with zipfile.ZipFile(results / "report.zip") as archive:
        published |= {Path("report.zip", n): archive.read(n) for n in archive.namelist()}
    assert len(published) > 20
    leaked = [str(p) for p, data in published.items() if secret.encode() in data]
    assert not leaked, f"server.env value published in {leaked}"
    # the metadata job's params, shown in the report, keep the key
    report = (results / "report.html").read_text()
    assert re.search(rf'HF_TOKEN[\\"]*: [\\"]*{REDACTED}', report)
