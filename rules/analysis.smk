# Analysis and report: tables, plots, summary and study metadata from results/{study}/requests/*.parquet.
# Needs from common.smk: config (validated), STUDY, RESULTS, ENGINE, COVERAGE and COHORT_BY_ID (the cohorts),
# PROFILE and PROFILED.
# Code: workflow_scripts/analysis/ (file lists and report() flags in rule_items.py).
import functools
import json
import os

from workflow_scripts.analysis import rule_items
from workflow_scripts.code_version import source_digest
from workflow_scripts.redaction import redact_config

# `rule all` asks for these (common.smk's all_outputs)
analysis_outputs = functools.partial(rule_items.all_outputs, RESULTS)

# every analysis rule reruns when the analysis code changes
ANALYSIS_CODE = source_digest("analysis")


rule analysis_tables:
    input:
        # every setting's records, and the A/A twin's (rules/benchmark.smk)
        requests=expand(
            f"{RESULTS}/requests/{{setting}}.parquet", setting=list(COVERAGE)
        ),
        meta=expand(f"{RESULTS}/benchmark/{{cohort}}.json", cohort=list(COHORT_BY_ID)),
        external=[ext["path"] for ext in config["analysis"]["external"]],
        # the cost model's step cost shape (rules/profile.smk), where the engine and the settings allow one
        profile=[PROFILE] if PROFILED else [],
    output:
        **rule_items.table_outputs(RESULTS),
    log:
        f"{RESULTS}/logs/analysis/analysis_tables.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis_tables.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        cfg=rule_items.analysis_config_json(config),
        out_dir=lambda wildcards, output: os.path.dirname(output.summary_csv),
        profile=lambda wildcards, input: (
            f"--forward-profile {input.profile}" if input.profile else ""
        ),
    shell:
        "python -m workflow_scripts.analysis.tables --config-json {params.cfg:q}"
        " --requests {input.requests:q} --cohort-meta {input.meta:q} {params.profile}"
        " --out-dir {params.out_dir:q} > {log} 2>&1"


rule analysis_plots:
    input:
        summary=f"{RESULTS}/tables/summary.csv",
        improvement=f"{RESULTS}/tables/improvement.csv",
        quantiles=f"{RESULTS}/tables/latency_quantiles.csv",
        by_position=f"{RESULTS}/tables/acceptance_by_position.csv",
        cost_predictions=f"{RESULTS}/tables/cost_model_predictions.csv",
        cells=f"{RESULTS}/tables/cells.csv",
        decisions=f"{RESULTS}/tables/decisions.csv",
    output:
        **rule_items.plot_outputs(RESULTS),
    log:
        f"{RESULTS}/logs/analysis/analysis_plots.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis_plots.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        tables_dir=lambda wildcards, input: os.path.dirname(input.summary),
        out_dir=lambda wildcards, output: os.path.dirname(output.throughput_svg),
    shell:
        "python -m workflow_scripts.analysis.plots --tables-dir {params.tables_dir:q}"
        " --out-dir {params.out_dir:q} > {log} 2>&1"


rule analysis_summary:
    input:
        summary=f"{RESULTS}/tables/summary.csv",
        improvement=f"{RESULTS}/tables/improvement.csv",
        gap=f"{RESULTS}/tables/gap.csv",
        recommendation=f"{RESULTS}/tables/recommendation.csv",
        lossless=f"{RESULTS}/tables/lossless.csv",
        article_md=f"{RESULTS}/tables/article_tables.md",
        aa=f"{RESULTS}/tables/aa.csv",
        floor=f"{RESULTS}/tables/noise_floor.json",
        precision=f"{RESULTS}/tables/precision.csv",
        decisions=f"{RESULTS}/tables/decisions.csv",
        adaptive=f"{RESULTS}/tables/adaptive.csv",
        thresholds=f"{RESULTS}/tables/thresholds.csv",
        cells=f"{RESULTS}/tables/cells.csv",
        meta=expand(f"{RESULTS}/benchmark/{{cohort}}.json", cohort=list(COHORT_BY_ID)),
        cost_model_md=f"{RESULTS}/tables/cost_model.md",
        # the server's cost at the start of the run (rules/profile.smk), read beside tables/ by the summary
        served=SERVED_OVERHEAD if ENGINE == "embedded" else [],
    output:
        **rule_items.summary_outputs(RESULTS),
    log:
        f"{RESULTS}/logs/analysis/analysis_summary.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis_summary.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        cfg=rule_items.analysis_config_json(config),
        study=STUDY,
        tables_dir=lambda wildcards, input: os.path.dirname(input.summary),
    shell:
        # the article-style tables go to the log and to the terminal
        "python -m workflow_scripts.analysis.summary --config-json {params.cfg:q} --study {params.study:q}"
        " --tables-dir {params.tables_dir:q} --cohort-meta {input.meta:q}"
        " --out {output.md:q} --html {output.html:q} 2>&1 | tee {log}"


rule study_metadata:
    input:
        # the model's build_info.json exists only for the embedded engine's self-built pair
        model=[f"{RESULTS}/models/target"] if ENGINE == "embedded" else [],
        # refreshed with every analysis, so the recorded commit and packages are those that made the tables
        summary=f"{RESULTS}/tables/summary.csv",
    output:
        **rule_items.metadata_outputs(RESULTS),
    log:
        f"{RESULTS}/logs/analysis/study_metadata.log",
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        # params are shown in the report: no server.env values there either
        cfg=json.dumps(redact_config(config), sort_keys=True, default=str),
        phases=f"{RESULTS}/benchmarks",
        # the phase times count the measuring of the study's current cohorts, not of cohorts an older config had
        cohorts=sorted(COHORT_BY_ID),
        build_info=lambda wildcards, input: (
            f"--build-info {input.model}/build_info.json" if input.model else ""
        ),
    shell:
        "python -m workflow_scripts.analysis.metadata --config-json {params.cfg:q} {params.build_info}"
        " --phases-dir {params.phases:q} --cohorts {params.cohorts:q}"
        " --out-json {output.json:q} --out-html {output.html:q} > {log} 2>&1"
