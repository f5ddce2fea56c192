# Fused-MoE kernel tuning, install, roofline verdict and end-to-end A/B.
# Needs from common.smk: config (validated), RESULTS, ENGINE, LOGS, target_model().
# Code: workflow_scripts/moe/. Engine sglang: patch SGLang's tuner, tune shards on GPUs, merge, install.
# Engine embedded: tune the embedded engine's kernel on this CPU, same shards, merge and install.
import functools

from workflow_scripts.code_version import source_digest
from workflow_scripts.moe import rule_items as moe_items
from workflow_scripts.moe.ab import moe_pairs

MOE = f"{RESULTS}/moe"
MOE_CFG = config["moe"]
MOE_BATCH_SIZES = sorted(set(MOE_CFG["batch_sizes"]))
MOE_SHARDS = list(range(min(MOE_CFG["shards"], len(MOE_BATCH_SIZES))))
MOE_PAIRS = moe_pairs(config["settings"])
SGLANG = config["sglang"]

if ENGINE == "sglang" and MOE_CFG["tune"] and not SGLANG["checkout"]:
    raise WorkflowError(
        "sglang.checkout: set it to an SGLang source checkout; its benchmark/kernels/fused_moe_triton/ tuner "
        "is not in the wheel (or set moe.tune: false and every setting's moe_config: default)"
    )

if ENGINE == "sglang" and not MOE_CFG["tune"] and not MOE_CFG["device"]["name"]:
    if not (MOE_CFG["device"]["peak_tflops"] and MOE_CFG["device"]["mem_bw_gbs"]):
        raise WorkflowError(
            "moe.device.name: the roofline needs the GPU's name (or moe.device.peak_tflops and mem_bw_gbs) "
            "when moe.tune is false on engine sglang"
        )


# `rule all` asks for these (common.smk's all_outputs)
moe_outputs = functools.partial(moe_items.moe_outputs, MOE, MOE_CFG, bool(MOE_PAIRS))
# the embedded target is built by the DAG; an SGLang user's checkpoint is not tracked
MOE_MODEL_INPUT = [target_model()] if ENGINE == "embedded" else []


if ENGINE == "sglang":

    rule moe_patch_tuner:
        output:
            tuner=directory(f"{MOE}/tuner"),
            record=f"{MOE}/tuner_patch.json",
        log:
            f"{LOGS}/moe/patch_tuner.log",
        conda:
            "../envs/moe.yaml"
        threads: 1
        resources:
            mem_mb=1000,
            runtime=10,
            gpu=0,
        params:
            checkout=SGLANG["checkout"],
            model=moe_model_path,
            tp=SGLANG["tp_size"],
        shell:
            "python -m workflow_scripts.moe.patch_tuner --checkout {params.checkout:q} --model {params.model:q}"
            " --tp-size {params.tp} --out {output.tuner:q} --report {output.record:q} > {log} 2>&1"


if MOE_CFG["tune"]:

    rule moe_tune_shard:
        input:
            model=MOE_MODEL_INPUT,
            tuner=[f"{MOE}/tuner_patch.json"] if ENGINE == "sglang" else [],
        output:
            f"{MOE}/shards/{{shard}}.json",
        log:
            f"{LOGS}/moe/tune_shard_{{shard}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/moe_tune_shard_{{shard}}.tsv"
        wildcard_constraints:
            shard=r"\d+",
        conda:
            "../envs/moe.yaml"
        # CPU: a shard owns the machine, so its timings are not another job's noise; GPU: one GPU slot each
        threads: node_cores() if ENGINE == "embedded" else 1
        resources:
            mem_mb=8000,
            gpu=TUNE_SHARD_GPUS,
            runtime=600 if ENGINE == "sglang" else 60,
            # on CPU a shard times kernels: no benchmark or other shard may run meanwhile (GPU shards own GPUs)
            benchmark_slot=1 if ENGINE == "embedded" else 0,
        params:
            engine=ENGINE,
            model=moe_model_path,
            shards=len(MOE_SHARDS),
            batch_sizes=" ".join(map(str, MOE_BATCH_SIZES)),
            search=MOE_CFG["search"],
            seed=MOE_CFG["seed"],
            gpu_args=moe_items.shard_gpu_args(ENGINE, MOE, MOE_CFG, SGLANG),
            # time the kernel with the torch threads the embedded server will run it with
            torch_threads=lambda wildcards, threads: config["server"]["num_threads"]
            or threads,
            # the tuner's code, and on CPU the kernel it times
            code=(
                source_digest("moe", "engine")
                if ENGINE == "embedded"
                else source_digest("moe")
            ),
        shell:
            "python -m workflow_scripts.moe.tune_shard --engine {params.engine} --model {params.model:q}"
            " --shard {wildcards.shard} --shards {params.shards} --batch-sizes {params.batch_sizes}"
            " --search {params.search} --seed {params.seed} --threads {params.torch_threads} {params.gpu_args}"
            " --out {output:q} > {log} 2>&1"

    rule moe_merge:
        input:
            expand(f"{MOE}/shards/{{shard}}.json", shard=MOE_SHARDS),
        output:
            f"{MOE}/merged.json",
        log:
            f"{LOGS}/moe/merge.log",
        conda:
            "../envs/moe.yaml"
        threads: 1
        resources:
            mem_mb=1000,
            runtime=10,
            gpu=0,
        params:
            batch_sizes=" ".join(map(str, MOE_BATCH_SIZES)),
        shell:
            "python -m workflow_scripts.moe.merge --shards {input:q} --batch-sizes {params.batch_sizes}"
            " --out {output:q} > {log} 2>&1"

    rule moe_install:
        input:
            f"{MOE}/merged.json",
        output:
            installed=f"{MOE}/installed.json",
            configs=directory(f"{MOE}/configs"),
        log:
            f"{LOGS}/moe/install.log",
        conda:
            "../envs/moe.yaml"
        threads: 1
        resources:
            mem_mb=1000,
            runtime=10,
            gpu=0,
        params:
            expect=moe_items.expect_device_arg(MOE_CFG["device"]),
        shell:
            "python -m workflow_scripts.moe.install --merged {input:q}"
            " {params.expect} --out {output.installed:q} > {log} 2>&1"


rule moe_roofline:
    input:
        model=MOE_MODEL_INPUT,
        # on GPUs the device is the one the configs were tuned on, unless moe.device.name says otherwise
        merged=[f"{MOE}/merged.json"] if ENGINE == "sglang" and MOE_CFG["tune"] else [],
    output:
        csv=f"{MOE}/roofline.csv",
        svg=report(
            f"{MOE}/roofline.svg",
            caption="../report/moe_roofline.rst",
            category="5 MoE kernel",
            labels={"item": "Roofline verdict", "format": "SVG"},
        ),
    log:
        f"{LOGS}/moe/roofline.log",
    conda:
        "../envs/moe.yaml"
    # the CPU peak and bandwidth are measured: keep other jobs off the machine meanwhile
    threads: node_cores() if ENGINE == "embedded" else 1
    resources:
        mem_mb=4000,
        runtime=30,
        gpu=0,
        benchmark_slot=1 if ENGINE == "embedded" else 0,
    params:
        engine=ENGINE,
        model=moe_model_path,
        tp=SGLANG["tp_size"] if ENGINE == "sglang" else 1,
        batch_sizes=" ".join(map(str, MOE_BATCH_SIZES)),
        device=lambda wildcards, input: moe_items.roofline_device_args(
            MOE_CFG["device"], input.merged
        ),
    shell:
        "python -m workflow_scripts.moe.roofline --engine {params.engine} --model {params.model:q}"
        " --tp-size {params.tp} --batch-sizes {params.batch_sizes} {params.device} --threads {threads}"
        " --out {output.csv:q} --plot {output.svg:q} > {log} 2>&1"


if MOE_PAIRS:

    rule moe_ab:
        input:
            improvement=f"{RESULTS}/tables/improvement.csv",
            roofline=f"{MOE}/roofline.csv",
        output:
            csv=f"{MOE}/ab_vs_roofline.csv",
            svg=report(
                f"{MOE}/ab_vs_roofline.svg",
                caption="../report/moe_ab.rst",
                category="5 MoE kernel",
                labels={"item": "MoE A/B vs roofline", "format": "SVG"},
            ),
        log:
            f"{LOGS}/moe/ab.log",
        conda:
            "../envs/moe.yaml"
        threads: 1
        resources:
            mem_mb=1000,
            runtime=10,
            gpu=0,
        params:
            pairs=" ".join(f"--pair {t}:{d}:{k}" for t, d, k in MOE_PAIRS),
        shell:
            "python -m workflow_scripts.moe.ab --improvement {input.improvement:q} --roofline {input.roofline:q}"
            " {params.pairs} --out {output.csv:q} --plot {output.svg:q} > {log} 2>&1"
