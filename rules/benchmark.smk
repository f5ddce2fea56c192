rule benchmark:
    input:
        unpack(benchmark_inputs),
    output:
        f"{RESULTS}/requests/{{setting}}.parquet",
    log:
        job=f"{LOGS}/benchmark/{{setting}}.log",
        server=f"{LOGS}/server/{{setting}}.log",
    wildcard_constraints:
        setting="|".join(SETTINGS),
    conda:
        "../envs/engine.yaml"
    # a benchmark never shares the machine with another job: timings stay clean
    threads: node_cores()
    resources:
        mem_mb=8000,
        runtime=120,
        # all GPUs of the setting's tensor-parallel size (rules/scaleout.smk); a cluster profile gives it a whole node
        gpu=benchmark_gpus,
        benchmark_slot=1,
    params:
        plan=lambda wildcards: plan_json(config, wildcards.setting),
        models=benchmark_model_args,
        cells=lambda wildcards: f"{RESULTS}/cells/{wildcards.setting}",
    shell:
        "python -m workflow_scripts.client.run_setting --plan {params.plan:q} {params.models}"
        " --cells-dir {params.cells} --server-log {log.server}"
        " --out {output} --threads {threads} 2> {log.job}"
