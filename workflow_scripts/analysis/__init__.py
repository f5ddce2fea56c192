"""Analysis of the study's per-request records into tables, plots, a summary and a checked Snakemake report.

Modules (each CLI runs as ``python -m workflow_scripts.analysis.<name>``):
- metrics: the metric definitions (per-request and aggregate tok/s, TTFT, TPOT, ITL, acceptance), once.
- stats: seeded bootstrap CIs over repeats, the median − 1.4826·MAD score.
- external: tidy external result CSVs, validated with file/row/column errors.
- summarize, improvement, gap, recommend, lossless: the tables; ``improvement`` is also the article-table CLI.
- tables (CLI): every table into results/{study}/tables/.
- plots (CLI): the altair charts as HTML (offline) and SVG.
- summary (CLI): summary.md / summary.html.
- metadata (CLI): config, packages, hardware, model build info, git commit.
- browser_check (CLI + check_report()): renders report.html/.zip in headless Chromium and checks the charts drew.
- rule_items: output lists and report() flags for rules/analysis.smk.
"""
