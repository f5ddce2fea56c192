"""What a cluster profile must get right before anything is submitted: a real partition, and GPU requests that match
what each job uses. A wrong GPU count on a cluster either wastes GPUs for hours or starts a server that cannot fit, so
both are refused at parse time, with the profile key at fault in the message."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence

PARTITION_PLACEHOLDER = "<your-partition>"

# SGLang's flags (and argparse's unique-prefix forms, as the server accepts them) for the parallel sizes that multiply
# the GPUs one server occupies
_TP_FLAGS = ("--tensor-parallel-size", "--tp-size", "--tp")
_DP_FLAGS = ("--data-parallel-size", "--dp-size", "--dp")


class ScaleoutError(ValueError):
    """A cluster setting that would waste or starve resources; the message names the key to fix."""


def _flag_value(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of `names` in `args` (`--flag N` or `--flag=N`), as the server's argparse would read it."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            if eq:
                found = value
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


def setting_gpus(name: str, setting: Mapping, engine: str, tp_size: int) -> int:
    """GPUs one server of this setting occupies: 0 on the embedded engine; on SGLang its tensor-parallel size
    (sglang.tp_size, or --tp-size in the setting's extra_args, which the server reads last) times its data-parallel
    size unless DP attention runs the DP ranks inside the TP group."""
    if engine != "sglang":
        return 0
    args = [str(a) for a in setting.get("extra_args") or []]
    sizes = {}
    for key, flags, default in (("tp", _TP_FLAGS, tp_size), ("dp", _DP_FLAGS, 1)):
        raw = _flag_value(args, flags)
        try:
            sizes[key] = int(raw) if raw is not None else default
        except ValueError:
            raise ScaleoutError(f"settings.{name}.extra_args: {flags[0]} {raw!r} is not an integer") from None
        if sizes[key] < 1:
            raise ScaleoutError(f"settings.{name}.extra_args: {flags[0]} must be >= 1, got {sizes[key]}")
    if "--enable-dp-attention" in args:
        return sizes["tp"]
    return sizes["tp"] * sizes["dp"]


def plain_resources(resources: Mapping[str, object]) -> dict[str, object]:
    """Snakemake Resource objects as plain values. A value from a profile or the command line is a lazy Python
    expression; a literal one ('2', "'gpu:1'", 'debug') is read here as Snakemake would, anything else is skipped."""
    plain = {}
    for name, res in resources.items():
        if not res.is_evaluable():
            plain[name] = res.value
        elif isinstance(res.raw, str):
            try:
                plain[name] = ast.literal_eval(res.raw)
            except (ValueError, SyntaxError):
                if re.fullmatch(r"[\w.:<>,/-]*", res.raw):  # a bare word such as a partition name
                    plain[name] = res.raw
    return plain


def gres_gpus(gres: str) -> int:
    """GPUs in a Slurm GRES string: 'gpu' (1), 'gpu:2', 'gpu:a100:2', several comma-separated; other GRES count 0."""
    total = 0
    for item in str(gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        match = re.fullmatch(r"(\d+)", count)
        total += int(match.group(1)) if match else 1
    return total


def gpu_request(resources: Mapping[str, object]) -> int | None:
    """The GPUs a resource mapping asks a cluster for (`gres` wins over `gpu`, as it is passed last); None if neither."""
    if resources.get("gres") not in (None, ""):
        return gres_gpus(str(resources["gres"]))
    gpu = resources.get("gpu")
    if gpu in (None, ""):
        return None
    try:
        return int(gpu)
    except (TypeError, ValueError):
        raise ScaleoutError(f"resource gpu: {gpu!r} is not a whole number of GPUs") from None


def check_partition(
    default_resources: Mapping[str, object], rule_resources: Mapping[str, Mapping[str, object]]
) -> None:
    """Refuse a Slurm partition that is still the profile's placeholder, or empty."""
    scopes = {"default-resources": default_resources}
    scopes.update({f"set-resources {rule}": res for rule, res in rule_resources.items()})
    for where, resources in scopes.items():
        if "slurm_partition" not in resources:
            continue
        partition = str(resources["slurm_partition"] or "").strip().strip("'\"")
        if (
            not partition
            or partition == PARTITION_PLACEHOLDER
            or (partition.startswith("<") and partition.endswith(">"))
        ):
            raise ScaleoutError(
                f"{where}: slurm_partition is {partition!r}, not a partition. Set it in your Slurm profile"
                f" (profiles/slurm/config.yaml) to one of your cluster's partitions (see `sinfo -s`)."
            )


def check_gpu_requests(
    default_resources: Mapping[str, object],
    rule_resources: Mapping[str, Mapping[str, object]],
    needs: Mapping[str, Mapping[str, int]],
) -> None:
    """Refuse a GPU request that differs from what a job uses.

    `needs` maps each rule to {job label: GPUs}: for `benchmark` one entry per setting, for a tuning shard one GPU.
    A per-rule override must equal the need of every job of its rule; a default GPU request would land on rules that
    use none (model build, analysis).
    """
    default = gpu_request(default_resources)
    if default:
        raise ScaleoutError(
            f"default-resources: asks every job for {default} GPU(s), but the model build and the analysis use none."
            " Drop gpu/gres from default-resources: each rule asks for the GPUs it uses (benchmark: its setting's"
            " tensor-parallel size; a tuning shard: one)."
        )
    for rule, resources in rule_resources.items():
        asked = gpu_request(resources)
        if asked is None:
            continue
        # rules missing from `needs` run on CPUs
        rule_needs = needs.get(rule) or {rule: 0}
        if asked and resources.get("gres") and resources.get("gpu") not in (0, "0") and any(rule_needs.values()):
            raise ScaleoutError(
                f"set-resources {rule}: gres asks for GPUs and the rule's own gpu resource asks again (--gpus);"
                " set gpu: 0 next to gres"
            )
        for label, need in rule_needs.items():
            if asked > need:
                raise ScaleoutError(
                    f"set-resources {rule}: asks for {asked} GPU(s), more than {label} uses ({need}:"
                    f" {_why(rule, need)}). Remove the override: the rule asks for what each job needs."
                )
            if asked < need:
                raise ScaleoutError(
                    f"set-resources {rule}: asks for {asked} GPU(s), fewer than {label} needs ({need}:"
                    f" {_why(rule, need)}), so it could not run. Remove the override."
                )


def _why(rule: str, need: int) -> str:
    if rule == "benchmark":
        return "the engine runs on CPUs" if need == 0 else "its tensor-parallel x data-parallel size"
    return "it runs on CPUs" if need == 0 else "one GPU per tuning shard"
