# Measure: one job per cohort (the settings measured together in the same rounds), then one requests file per
# setting. Needs from common.smk: config (validated), RESULTS, LOGS, ENGINE, benchmark_inputs, benchmark_model_args.
# Code: workflow_scripts/client/ (cohorts.py plans the cohorts when the workflow is parsed, run_cohort.py runs one).
import json
import re

from workflow_scripts.client.cohorts import cohort_plan


rule benchmark:
    input:
        unpack(benchmark_inputs),
    output:
        records=f"{RESULTS}/benchmark/{{cohort}}.parquet",
        meta=f"{RESULTS}/benchmark/{{cohort}}.json",
    log:
        f"{LOGS}/benchmark/{{cohort}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/benchmark_{{cohort}}.tsv"
    wildcard_constraints:
        # a cohort id names what it measures (steps3-vs-baseline-1a2b3c4d): `snakemake -n` shows it
        cohort="|".join(map(re.escape, COHORT_BY_ID)) or "no-cohort",
    conda:
        "../envs/engine.yaml"
    # a benchmark never shares the machine with another job: timings stay clean
    threads: node_cores()
    resources:
        mem_mb=cohort_mem_mb,
        runtime=240,
        # the GPUs of the servers it holds at once (rules/scaleout.smk); a cluster profile gives it a whole node
        gpu=cohort_gpus,
        benchmark_slot=1,
    params:
        plan=lambda wildcards: json.dumps(
            cohort_plan(config, COHORT_BY_ID[wildcards.cohort]), sort_keys=True
        ),
        models=benchmark_model_args,
        cells=lambda wildcards: f"{RESULTS}/cells/{wildcards.cohort}",
        servers=lambda wildcards: f"{LOGS}/server/{wildcards.cohort}",
    shell:
        "python -m workflow_scripts.client.run_cohort --plan {params.plan:q} {params.models}"
        " --cells-dir {params.cells:q} --server-log-dir {params.servers:q}"
        " --out {output.records:q} --meta-out {output.meta:q} --threads {threads}"
        # $PPID: the Snakemake that runs this shell; if it is killed, the job stops instead of measuring on alone
        " --supervisor-pid $PPID 2> {log}"


rule requests:
    input:
        lambda wildcards: [
            f"{RESULTS}/benchmark/{cohort}.parquet"
            for cohort in sorted({cell[0] for cell in COVERAGE[wildcards.setting]})
        ],
    output:
        f"{RESULTS}/requests/{{setting}}.parquet",
    log:
        f"{LOGS}/requests/{{setting}}.log",
    wildcard_constraints:
        setting="|".join(COVERAGE),
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    params:
        cells=lambda wildcards: json.dumps(COVERAGE[wildcards.setting]),
    shell:
        "python -m workflow_scripts.client.gather --setting {wildcards.setting} --cells {params.cells:q}"
        " --out {output:q} {input:q} > {log} 2>&1"
