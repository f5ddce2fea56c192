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


# What the HTTP server costs the engine: served ÷ in-process decode speed of the baseline at concurrency 1, measured
# once at the start of the run (its priority puts it before the benchmarks, its benchmark slot keeps it apart);
# the summary prints it and warns when the server, not speculation, dominates the study's cells.
# Code: workflow_scripts/profiling/served_overhead.py.
SERVED_OVERHEAD = f"{RESULTS}/profile/served_overhead.json"


if ENGINE == "embedded":

    rule served_overhead:
        input:
            target=target_model(),
        output:
            SERVED_OVERHEAD,
        log:
            f"{LOGS}/served_overhead.log",
        benchmark:
            f"{RESULTS}/benchmarks/served_overhead.tsv"
        priority: 50
        conda:
            "../envs/engine.yaml"
        threads: node_cores()
        resources:
            mem_mb=3000,
            runtime=10,
            gpu=0,
            benchmark_slot=1,
        params:
            torch_threads=lambda wildcards, threads: config["server"]["num_threads"]
            or threads,
            max_running=config["server"]["max_running_requests"],
            code=source_digest("engine", "server", "profiling"),
        shell:
            "python -m workflow_scripts.profiling.served_overhead --target {input.target:q}"
            " --threads {params.torch_threads} --max-running-requests {params.max_running}"
            " --out {output:q} 2> {log}"
