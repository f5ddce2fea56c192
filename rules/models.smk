from workflow_scripts.code_version import source_digest

if ENGINE == "embedded":

    rule build_models:
        output:
            target=directory(f"{RESULTS}/models/target"),
            draft=directory(f"{RESULTS}/models/draft"),
        log:
            f"{LOGS}/build_models.log",
        benchmark:
            f"{RESULTS}/benchmarks/build_models.tsv"
        conda:
            "../envs/engine.yaml"
        # the default preset trains on two threads, the smoke one on one (presets.py: a fixed count, for the same bytes
        # on every machine)
        threads: 2
        resources:
            mem_mb=4000,
            runtime=30,
            gpu=0,
        params:
            preset=config["model"]["preset"],
            seed=config["model"]["seed"],
            # a preset or training-code edit rebuilds the pair
            code=source_digest("models"),
        shell:
            "python -m workflow_scripts.models.build --preset {params.preset} --seed {params.seed}"
            " --target-out {output.target} --draft-out {output.draft} 2> {log}"
