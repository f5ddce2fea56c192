import shlex
from pathlib import Path

from snakemake.utils import validate

from workflow_scripts.client.cohorts import coverage, plan_cohorts, twin_name
from workflow_scripts.client.plan import setting_workloads
from workflow_scripts.config_errors import schema_error
from workflow_scripts.analysis.schedule import bands_problem
from workflow_scripts.launcher.command import SettingError, check_setting

config_problem = schema_error(config, Path(workflow.basedir, "config", "schema.yaml"))
if config_problem:
    raise WorkflowError(config_problem)
validate(config, schema="../config/schema.yaml", set_default=True)


def check_config(config):
    """What the schema cannot say: cross references and SGLang's speculation-flag rules, checked before any job."""
    for name, setting in config["settings"].items():
        try:
            check_setting(name, setting, config["engine"])
        except SettingError as err:
            raise WorkflowError(str(err))
        for workload in setting_workloads(config, name):
            if workload not in config["workloads"]:
                raise WorkflowError(
                    f"settings.{name}.workloads: unknown workload {workload!r}; "
                    f"allowed: {', '.join(config['workloads'])}"
                )
        if setting["moe_config"] == "tuned" and not config["moe"]["tune"]:
            raise WorkflowError(
                f"settings.{name}.moe_config is tuned but moe.tune is false; set moe.tune: true or moe_config: default"
            )
    if problem := bands_problem(config["analysis"]["bands"]):
        raise WorkflowError(problem)
    if config["analysis"]["baseline"] not in config["settings"]:
        raise WorkflowError(
            f"analysis.baseline: {config['analysis']['baseline']!r} is not a setting; "
            f"allowed: {', '.join(config['settings'])}"
        )
    if config["engine"] == "sglang" and not config["sglang"]["model_path"]:
        raise WorkflowError("sglang.model_path: required when engine is sglang")
    bench = config["benchmark"]
    if bench["max_repeats"] < bench["repeats"]:
        raise WorkflowError(
            f"benchmark.max_repeats: {bench['max_repeats']} is below benchmark.repeats ({bench['repeats']}),"
            " the minimum number of rounds"
        )
    if bench["schedule"] == "sliced" and config["engine"] != "embedded":
        raise WorkflowError(
            "benchmark.schedule: sliced freezes each server outside its turn, which only the embedded engine"
            " allows; use auto, interleaved or blocked on SGLang"
        )
    twin = twin_name(config["analysis"]["baseline"])
    if bench["aa_control"] and twin in config["settings"]:
        raise WorkflowError(
            f"settings.{twin}: the name is taken by the A/A twin of analysis.baseline; rename the setting"
            " or set benchmark.aa_control: false"
        )


check_config(config)

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
# whether the study has fixed-acceptance calibration cells (rules/calibration.smk)
CALIBRATED = any(
    s.get("simulate_acc_len") is not None for s in config["settings"].values()
)
ENGINE = config["engine"]
LOGS = f"{RESULTS}/logs"


def target_model():
    """The target model dir: built by the models rule (embedded), or the user's checkpoint (sglang)."""
    if ENGINE == "embedded":
        return f"{RESULTS}/models/target"
    return config["sglang"]["model_path"]


def draft_model():
    if ENGINE == "embedded":
        return f"{RESULTS}/models/draft"
    return config["sglang"]["draft_path"]


# The cohorts of this run (workflow_scripts/client/cohorts.py): planned from the config and the cells cache.
try:
    COHORTS = plan_cohorts(config, Path(RESULTS, "cells"))
except ValueError as err:
    raise WorkflowError(str(err))
COHORT_BY_ID = {cohort.id: cohort for cohort in COHORTS}
# member name -> the (cohort, workload, concurrency) cells its requests file holds
COVERAGE = coverage(config, COHORTS)


def benchmark_inputs(wildcards):
    """The built pair on the embedded engine (a user's SGLang checkpoint is not tracked), and the installed MoE
    configs when a member of the cohort runs `moe_config: tuned`."""
    inputs = {}
    if ENGINE == "embedded":
        inputs.update(target=target_model(), draft=draft_model())
    members = COHORT_BY_ID[wildcards.cohort].members.values()
    if any(member["args"].get("moe_config") == "tuned" for member in members):
        inputs["moe"] = f"{RESULTS}/moe/installed.json"
    return inputs


# the forward profile (rules/profile.smk): the cost model's step cost shape, on the embedded engine
PROFILE = f"{RESULTS}/profile/forward_profile.csv"
# the settings whose step the profile times: a draft model's (an n-gram lookup has no draft forwards)
DRAFTING = [
    name
    for name, args in config["settings"].items()
    if str(args.get("speculative_algorithm", "")).upper() == "STANDALONE"
]
PROFILED = ENGINE == "embedded" and bool(DRAFTING)


def profile_inputs(wildcards):
    """The built pair, and the installed MoE configs when the drafting settings run `moe_config: tuned`."""
    inputs = {"target": target_model(), "draft": draft_model()}
    if any(config["settings"][name].get("moe_config") == "tuned" for name in DRAFTING):
        inputs["moe"] = f"{RESULTS}/moe/installed.json"
    return inputs


def cohort_mem_mb(wildcards):
    """Memory of a cohort job: the client plus every server it may hold at once (~1 GB each on the embedded pair)."""
    return 2000 + 1000 * len(COHORT_BY_ID[wildcards.cohort].members)


def benchmark_model_args(wildcards, input):
    """--target/--draft/--moe-installed of workflow_scripts.client.run_cohort."""
    target = input.target if "target" in input.keys() else target_model()
    draft = input.draft if "draft" in input.keys() else draft_model()
    args = f"--target {shlex.quote(target)}"
    if draft:
        args += f" --draft {shlex.quote(draft)}"
    if "moe" in input.keys():
        args += f" --moe-installed {shlex.quote(input.moe)}"
    return args


def moe_model_path(wildcards, input):
    """The MoE rules' model: the built target (a tracked input) on the embedded engine, the user's checkpoint on SGLang."""
    return input.model[0] if ENGINE == "embedded" else target_model()


def all_outputs():
    return analysis_outputs() + moe_outputs()


def print_article_tables():
    """The article-style tables, printed at the end of a successful run."""
    for path in sorted(Path(RESULTS, "tables").glob("article_*.md")):
        print(f"\n## {path.stem}\n\n{path.read_text()}")
