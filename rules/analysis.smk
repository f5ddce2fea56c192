# Analysis and report: tables, plots, summary and study metadata from results/{study}/requests/*.parquet.
# Needs from common.smk: config (validated), RESULTS, SETTINGS, ENGINE. Code lives in workflow_scripts/analysis/.
import json

ANALYSIS_LOGS = f"{RESULTS}/logs/analysis"
TABLES_DIR = f"{RESULTS}/tables"
PLOTS_DIR = f"{RESULTS}/plots"
PLOT_NAMES = ["throughput", "speedup", "acceptance", "latency", "pareto"]
PLOT_TITLES = {
    "throughput": "Throughput vs concurrency",
    "speedup": "Speedup with CI",
    "acceptance": "Acceptance length",
    "latency": "Latency distributions",
    "pareto": "Per-request vs aggregate (Pareto)",
}
PLOT_CATEGORY = {
    "throughput": "2 Throughput and speedup",
    "speedup": "2 Throughput and speedup",
    "pareto": "2 Throughput and speedup",
    "acceptance": "3 Acceptance and lossless",
    "latency": "4 Latency",
}
# tables with an HTML view in the report: name -> (category, caption)
TABLE_VIEWS = {
    "article_tables": ("1 Summary", "article_tables"),
    "recommendation": ("1 Summary", "recommendation"),
    "summary": ("2 Throughput and speedup", "summary_table"),
    "improvement": ("2 Throughput and speedup", "improvement"),
    "gap": ("2 Throughput and speedup", "gap"),
    "lossless": ("3 Acceptance and lossless", "lossless"),
}
CSV_TABLES = [
    "summary",
    "cells",
    "improvement",
    "article_tables",
    "gap",
    "recommendation",
    "recommendation_scores",
    "lossless",
    "latency_quantiles",
]


def analysis_config_json():
    """The part of the config the analysis reads; a change to it re-runs the analysis (params are tracked)."""
    return json.dumps(
        {key: config[key] for key in ("settings", "workloads", "analysis")},
        sort_keys=True,
        default=str,
    )


def table_view(name):
    category, caption = TABLE_VIEWS[name]
    return report(
        f"{TABLES_DIR}/{name}.html",
        caption=f"../report/{caption}.rst",
        category=category,
        labels={"item": name.replace("_", " "), "format": "table"},
    )


def csv_item(name):
    return report(
        f"{TABLES_DIR}/{name}.csv",
        caption="../report/csv.rst",
        category="6 Data (CSV)",
        labels={"item": f"{name}.csv", "format": "CSV"},
    )


def plot_item(name, ext):
    return report(
        f"{PLOTS_DIR}/{name}.{ext}",
        caption=f"../report/plot_{name}.rst",
        category=PLOT_CATEGORY[name],
        labels={
            "item": PLOT_TITLES[name],
            "format": "static SVG" if ext == "svg" else "interactive HTML",
        },
    )


def build_info_inputs(wildcards):
    """The model's build_info.json exists only for the embedded engine's self-built pair."""
    if ENGINE == "embedded":
        return {"build_info": f"{RESULTS}/models/target"}
    return {}


def build_info_flag(wildcards, input):
    if "build_info" in input.keys():
        return f"--build-info {input.build_info}/build_info.json"
    return ""


rule analysis_tables:
    input:
        requests=expand(f"{RESULTS}/requests/{{setting}}.parquet", setting=SETTINGS),
        external=[ext["path"] for ext in config["analysis"]["external"]],
    output:
        **{f"{name}_csv": csv_item(name) for name in CSV_TABLES},
        **{f"{name}_html": table_view(name) for name in TABLE_VIEWS},
        article_md=f"{TABLES_DIR}/article_tables.md",
    log:
        f"{ANALYSIS_LOGS}/analysis_tables.log",
    conda:
        "../envs/analysis.yaml"
    params:
        cfg=analysis_config_json(),
        out_dir=TABLES_DIR,
    shell:
        "python -m workflow_scripts.analysis.tables --config-json {params.cfg:q}"
        " --requests {input.requests:q} --out-dir {params.out_dir:q} > {log} 2>&1"


rule analysis_plots:
    input:
        summary=f"{TABLES_DIR}/summary.csv",
        improvement=f"{TABLES_DIR}/improvement.csv",
        quantiles=f"{TABLES_DIR}/latency_quantiles.csv",
    output:
        **{
            f"{name}_{ext}": plot_item(name, ext)
            for name in PLOT_NAMES
            for ext in ("svg", "html")
        },
    log:
        f"{ANALYSIS_LOGS}/analysis_plots.log",
    conda:
        "../envs/analysis.yaml"
    params:
        tables_dir=TABLES_DIR,
        out_dir=PLOTS_DIR,
    shell:
        "python -m workflow_scripts.analysis.plots --tables-dir {params.tables_dir:q}"
        " --out-dir {params.out_dir:q} > {log} 2>&1"


rule analysis_summary:
    input:
        summary=f"{TABLES_DIR}/summary.csv",
        improvement=f"{TABLES_DIR}/improvement.csv",
        gap=f"{TABLES_DIR}/gap.csv",
        recommendation=f"{TABLES_DIR}/recommendation.csv",
        lossless=f"{TABLES_DIR}/lossless.csv",
        article_md=f"{TABLES_DIR}/article_tables.md",
    output:
        md=report(
            f"{RESULTS}/summary.md",
            caption="../report/csv.rst",
            category="6 Data (CSV)",
            labels={"item": "summary.md", "format": "markdown"},
        ),
        html=report(
            f"{RESULTS}/summary.html",
            caption="../report/summary.rst",
            category="1 Summary",
            labels={"item": "study summary", "format": "text"},
        ),
    log:
        f"{ANALYSIS_LOGS}/analysis_summary.log",
    conda:
        "../envs/analysis.yaml"
    params:
        cfg=analysis_config_json(),
        study=STUDY,
        tables_dir=TABLES_DIR,
    shell:
        # the article-style tables go to the log and to the terminal
        "python -m workflow_scripts.analysis.summary --config-json {params.cfg:q} --study {params.study:q}"
        " --tables-dir {params.tables_dir:q} --out {output.md:q} --html {output.html:q} 2>&1 | tee {log}"


rule study_metadata:
    input:
        unpack(build_info_inputs),
    output:
        json=f"{RESULTS}/metadata/study.json",
        html=report(
            f"{RESULTS}/metadata/study.html",
            caption="../report/metadata.rst",
            category="5 Study metadata",
            labels={
                "item": "config, packages, hardware, model, git",
                "format": "text",
            },
        ),
    log:
        f"{ANALYSIS_LOGS}/study_metadata.log",
    conda:
        "../envs/analysis.yaml"
    params:
        cfg=json.dumps(config, sort_keys=True, default=str),
        build_info=build_info_flag,
    shell:
        "python -m workflow_scripts.analysis.metadata --config-json {params.cfg:q} {params.build_info}"
        " --out-json {output.json:q} --out-html {output.html:q} > {log} 2>&1"


def analysis_outputs():
    """Every file the analysis produces; `rule all` asks for these."""
    return [
        *expand(f"{TABLES_DIR}/{{name}}.csv", name=CSV_TABLES),
        *expand(f"{TABLES_DIR}/{{name}}.html", name=list(TABLE_VIEWS)),
        *expand(f"{PLOTS_DIR}/{{name}}.{{ext}}", name=PLOT_NAMES, ext=["svg", "html"]),
        f"{RESULTS}/summary.md",
        f"{RESULTS}/summary.html",
        f"{RESULTS}/metadata/study.json",
        f"{RESULTS}/metadata/study.html",
    ]
