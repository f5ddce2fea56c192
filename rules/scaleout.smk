# Scale-out: what each job asks an executor for, and the checks a cluster profile must pass before anything is
# submitted (parse time, so a dry run refuses too). Needs from common.smk: config (validated), ENGINE.
# Code: workflow_scripts/scaleout/checks.py. Profiles: profiles/default (local), profiles/slurm. Docs: docs/scaleout.md.
from workflow_scripts.scaleout import checks as profile_checks


def cohort_schedule_gpus(cohort):
    """GPUs of a cohort job: every member's at once when its servers run side by side (interleaved), else the
    largest member's (blocked or sequential: one server at a time). An interleaved SGLang cohort that needs more
    GPUs than sglang.node_gpus is refused here, before any job."""
    per_member = [
        setting_gpus_of(name, member["args"]) for name, member in cohort.members.items()
    ]
    together = sum(per_member)
    schedule = cohort.schedule
    node = config["sglang"]["node_gpus"]
    if (
        ENGINE == "sglang"
        and schedule == "interleaved"
        and (node is None or together > node)
    ):
        raise WorkflowError(
            f"benchmark.schedule: interleaved runs every setting's server at once; {len(per_member)} SGLang servers"
            f" need {together} GPUs but sglang.node_gpus is {node}. Use schedule blocked (or auto), or set"
            " sglang.node_gpus to the GPUs of one node"
        )
    if schedule == "interleaved" or (
        schedule == "auto"
        and ENGINE == "sglang"
        and node is not None
        and together <= node
    ):
        return together
    return max(per_member)


def setting_gpus_of(name, args):
    return profile_checks.setting_gpus(name, args, ENGINE, config["sglang"]["tp_size"])


def cohort_gpus(wildcards):
    return cohort_schedule_gpus(COHORT_BY_ID[wildcards.cohort])


# one GPU per tuning shard on SGLang; the embedded engine tunes on CPUs
TUNE_SHARD_GPUS = 1 if ENGINE == "sglang" else 0


def node_cores():
    """Threads of a job that keeps its machine to itself (model build, benchmark, CPU tuning).

    Locally: every core given with --cores. A cluster run's main process has no --cores (there it would cap the
    whole cluster), so the profile's max-threads, the cores of one node, sizes the request; inside the job,
    Snakemake runs with --cores all on the node it got.
    """
    cores = workflow.resource_settings.cores or workflow.resource_settings.max_threads
    if cores is None:
        raise WorkflowError(
            "threads: the model build and the benchmarks use every core of their machine; give --cores N to run"
            " locally, or max-threads (the cores of one node) on a cluster, as profiles/slurm/config.yaml does"
        )
    return cores


def check_cluster_profile():
    """Refuse a placeholder partition and GPU requests that differ from what the jobs use."""
    settings = workflow.resource_settings
    default = profile_checks.plain_resources(settings.default_resources or {})
    per_rule = {
        name: profile_checks.plain_resources(res)
        for name, res in settings.overwrite_resources.items()
    }
    try:
        needs = {
            "benchmark": {
                f"cohort {cohort.id!r}": cohort_schedule_gpus(cohort)
                for cohort in COHORTS
            },
            "moe_tune_shard": {"a tuning shard": TUNE_SHARD_GPUS},
        }
        profile_checks.check_partition(default, per_rule)
        profile_checks.check_gpu_requests(default, per_rule, needs)
    except profile_checks.ScaleoutError as err:
        raise WorkflowError(str(err))


check_cluster_profile()
