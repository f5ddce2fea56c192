# From verdict to deployment: the per-batch-size step schedule and its SGLang, settings and vLLM forms.
# Needs from common.smk: config (validated), RESULTS; from analysis.smk: ANALYSIS_CODE. `rule all` asks for its outputs.
# Code: workflow_scripts/analysis/schedule.py (docs/deployment.md).
from workflow_scripts.analysis import rule_items
from workflow_scripts.analysis.schedule import DEPLOY_FILES


rule step_schedule:
    input:
        recommendation=f"{RESULTS}/tables/recommendation.csv",
        improvement=f"{RESULTS}/tables/improvement.csv",
        predictions=f"{RESULTS}/tables/cost_model_predictions.csv",
        summary=f"{RESULTS}/tables/summary.csv",
    output:
        csv=report(
            f"{RESULTS}/tables/step_schedule.csv",
            caption="../report/step_schedule.rst",
            category="1 Summary",
            labels={"item": "step schedule", "format": "CSV"},
        ),
        svg=report(
            f"{RESULTS}/plots/step_schedule.svg",
            caption="../report/plot_step_schedule.rst",
            category="1 Summary",
            labels={"item": "step schedule over throughput", "format": "SVG"},
        ),
        html=f"{RESULTS}/plots/step_schedule.html",
        deploy=[
            f"{RESULTS}/deploy/{workload}/{name}"
            for workload in config["workloads"]
            for name in DEPLOY_FILES
        ],
    log:
        f"{RESULTS}/logs/deploy/step_schedule.log",
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    params:
        code=ANALYSIS_CODE,
        cfg=rule_items.analysis_config_json(config),
        max_batch=config["server"]["max_running_requests"],
        deploy_dir=lambda wildcards, output: os.path.dirname(
            os.path.dirname(output.deploy[0])
        ),
        plot_dir=lambda wildcards, output: os.path.dirname(output.svg),
    shell:
        "python -m workflow_scripts.analysis.schedule --recommendation {input.recommendation:q}"
        " --improvement {input.improvement:q} --predictions {input.predictions:q}"
        " --summary {input.summary:q} --config-json {params.cfg:q} --max-batch {params.max_batch}"
        " --out-csv {output.csv:q} --deploy-dir {params.deploy_dir:q} --plot-dir {params.plot_dir:q}"
        " > {log} 2>&1"
