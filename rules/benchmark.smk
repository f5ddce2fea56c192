def model_inputs(wildcards):
    """The built pair is an input on the embedded engine; a user's SGLang checkpoint is not tracked."""
    if ENGINE != "embedded":
        return {}
    return {"target": f"{RESULTS}/models/target", "draft": f"{RESULTS}/models/draft"}


def moe_inputs(wildcards):
    if config["settings"][wildcards.setting]["moe_config"] == "tuned":
        return {"moe": f"{RESULTS}/moe/installed.json"}
    return {}


def moe_flag(wildcards, input):
    return f"--moe-installed {input.moe}" if "moe" in input.keys() else ""


def draft_flag(wildcards):
    draft = draft_model()
    return f"--draft {draft}" if draft else ""


rule benchmark:
    input:
        unpack(model_inputs),
        unpack(moe_inputs),
    output:
        f"{RESULTS}/requests/{{setting}}.parquet",
    params:
        plan=lambda wildcards: plan_json(config, wildcards.setting),
        target=target_model(),
        draft=draft_flag,
        moe=moe_flag,
        cells=lambda wildcards: f"{RESULTS}/cells/{wildcards.setting}",
    log:
        job=f"{LOGS}/benchmark/{{setting}}.log",
        server=f"{LOGS}/server/{{setting}}.log",
    wildcard_constraints:
        setting="|".join(SETTINGS),
    # a benchmark never shares the machine with another job: timings stay clean
    threads: node_cores()
    resources:
        mem_mb=8000,
        runtime=120,
        # all GPUs of the setting's tensor-parallel size (rules/scaleout.smk); a cluster profile gives it a whole node
        gpu=benchmark_gpus,
        benchmark_slot=1,
    conda:
        "../envs/engine.yaml"
    shell:
        "python -m workflow_scripts.client.run_setting --plan {params.plan:q} --target {params.target}"
        " {params.draft} {params.moe} --cells-dir {params.cells} --server-log {log.server}"
        " --out {output} --threads {threads} 2> {log.job}"
