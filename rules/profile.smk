# Profile the embedded engine's forwards: what one STANDALONE step of k drafts costs against a plain decode step at
# each concurrency, timed in-process (the cost model shapes its step cost with it, instead of a line in k).
# Needs from common.smk: config (validated), RESULTS, LOGS, PROFILE, profile_inputs; node_cores (scaleout.smk).
# Code: workflow_scripts/profiling/forward_profile.py.


if PROFILED:

    rule forward_profile:
        input:
            unpack(profile_inputs),
        output:
            PROFILE,
        log:
            f"{LOGS}/forward_profile.log",
        benchmark:
            f"{RESULTS}/benchmarks/forward_profile.tsv"
        conda:
            "../envs/engine.yaml"
        # it times forwards: like a benchmark, it keeps the machine to itself
        threads: node_cores()
        resources:
            # seven engines (k = 0..6), each with KV caches for the largest concurrency: 7.6 GB at the peak on
            # the default pair
            mem_mb=9000,
            runtime=30,
            gpu=0,
            benchmark_slot=1,
        params:
            concurrency=" ".join(map(str, config["benchmark"]["concurrency"])),
            max_steps=config["analysis"]["predict_max_steps"],
            repeats=config["analysis"]["step_profile"]["repeats"],
            min_seconds=config["analysis"]["step_profile"]["min_seconds"],
            # the torch threads each server runs with
            torch_threads=lambda wildcards, threads: config["server"]["num_threads"]
            or threads,
            moe=lambda wildcards, input: (
                f"--moe-installed {input.moe}" if "moe" in input.keys() else ""
            ),
            code=source_digest("engine", "profiling"),
        shell:
            "python -m workflow_scripts.profiling.forward_profile --target {input.target:q} --draft {input.draft:q}"
            " --concurrency {params.concurrency} --max-steps {params.max_steps} --threads {params.torch_threads}"
            " --repeats {params.repeats} --min-seconds {params.min_seconds}"
            " {params.moe} --out {output:q} 2> {log}"
