# Fixed-acceptance calibration: step costs from the settings with `simulate_acc_len` alone, and the study's other
# speculative cells against them (prediction, the upper bound at perfect acceptance, the gap).
# Needs from common.smk: config (validated), RESULTS, COVERAGE; from analysis.smk: ANALYSIS_CODE. `rule all` asks
# for its outputs when a setting is a calibration cell (config/cost-model.yaml has them).
# Code: workflow_scripts/analysis/calibration.py (docs/deployment.md).
from workflow_scripts.analysis import rule_items


rule calibration:
    input:
        # the cells in the cost model's terms need the records themselves: histograms, lengths, forward times
        requests=expand(
            f"{RESULTS}/requests/{{setting}}.parquet", setting=list(COVERAGE)
        ),
    output:
        costs=report(
            f"{RESULTS}/tables/calibration_costs.csv",
            caption="../report/calibration.rst",
            category="2 Throughput and speedup",
            labels={"item": "calibrated step costs", "format": "CSV"},
        ),
        gap=report(
            f"{RESULTS}/tables/calibration_gap.csv",
            caption="../report/calibration.rst",
            category="2 Throughput and speedup",
            labels={"item": "speedup against the calibrated bound", "format": "CSV"},
        ),
    log:
        f"{RESULTS}/logs/analysis/calibration.log",
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        cfg=rule_items.analysis_config_json(config),
    shell:
        "python -m workflow_scripts.analysis.calibration --config-json {params.cfg:q} --requests {input.requests:q}"
        " --out-costs {output.costs:q} --out-gap {output.gap:q} > {log} 2>&1"
