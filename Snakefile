# specstudy: tune SGLang speculative decoding and fused-MoE kernels, reproducibly.
# `snakemake --cores 4` runs the default embedded-CPU study; see README.md for SGLang on GPUs and Slurm.


from snakemake.utils import min_version

min_version("9.0")


# A study given with --configfile stands alone: it is not merged into the default study's settings.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/scaleout.smk"
include: "rules/models.smk"
include: "rules/moe.smk"
include: "rules/benchmark.smk"
include: "rules/profile.smk"
include: "rules/analysis.smk"
include: "rules/deploy.smk"
include: "rules/calibration.smk"


# gathering a setting's records from its cohorts only moves files: it runs where Snakemake runs, never as a cluster
# job that would queue for a node
localrules:
    all,
    requests,


rule all:
    default_target: True
    input:
        all_outputs(),
        rules.step_schedule.output,
        rules.calibration.output if CALIBRATED else [],


onsuccess:
    print_article_tables()
