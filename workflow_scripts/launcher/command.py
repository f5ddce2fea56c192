"""Turn a study setting into a server command line.

A setting holds SGLang's server flags with dashes as underscores, so the same setting drives real SGLang
(`python -m sglang.launch_server`) and the embedded engine (`python -m workflow_scripts.engine.launch_server`),
which accepts the same flag names. Only this module and `process.py` know which engine is behind the URL.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# Setting keys that become server flags, in the order SGLang's docs list them.
SPEC_KEYS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
# Setting keys that are study-side, not server flags.
STUDY_KEYS = ("moe_config", "workloads", "extra_args", "speculative_draft_model_path", "max_running_requests")
ALGORITHMS_WITH_DRAFT = ("STANDALONE", "EAGLE", "EAGLE3")


class SettingError(ValueError):
    """A setting whose speculation flags SGLang would refuse; the message names the setting and the key."""


def check_setting(name: str, setting: dict) -> None:
    """Apply SGLang's speculation-flag rules before any server starts.

    SGLang wants steps, topk and draft tokens set all together or not at all, and with topk 1 the number of
    draft tokens must be steps + 1 (see `ServerArgs._handle_speculative_decoding`).
    """
    unknown = set(setting) - set(SPEC_KEYS) - set(STUDY_KEYS)
    if unknown:
        raise SettingError(f"settings.{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SPEC_KEYS + STUDY_KEYS)}")
    algorithm = setting.get("speculative_algorithm")
    numeric = {k: setting.get(k) for k in SPEC_KEYS[1:]}
    given = [k for k, v in numeric.items() if v is not None]
    if algorithm is None:
        extra = given + (["speculative_draft_model_path"] if setting.get("speculative_draft_model_path") else [])
        if extra:
            raise SettingError(f"settings.{name}: {extra[0]} is set but speculative_algorithm is not")
        return
    if given and len(given) != len(numeric):
        missing = sorted(set(numeric) - set(given))
        raise SettingError(
            f"settings.{name}: set speculative_num_steps, speculative_eagle_topk and "
            f"speculative_num_draft_tokens together or not at all (missing: {', '.join(missing)})"
        )
    if given and numeric["speculative_eagle_topk"] == 1:
        expected = numeric["speculative_num_steps"] + 1
        if numeric["speculative_num_draft_tokens"] != expected:
            raise SettingError(
                f"settings.{name}: speculative_num_draft_tokens must be speculative_num_steps + 1 = {expected} "
                f"with speculative_eagle_topk 1, got {numeric['speculative_num_draft_tokens']}"
            )


@dataclass(frozen=True)
class ServerSpec:
    """Everything the launcher needs to start one setting's server, independent of the engine."""

    engine: str  # "embedded" | "sglang"
    model_path: str
    draft_path: str | None
    host: str
    max_running_requests: int
    random_seed: int
    num_threads: int | None = None  # embedded only
    sglang_python: str = "python"
    tp_size: int = 1
    mem_fraction_static: float | None = None


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def build_command(spec: ServerSpec, setting: dict, port: int) -> list[str]:
    """The full argv of the server for one setting; `--max-running-requests` is always set (SGLang resets it
    to 48 under speculation otherwise, which would silently cap a concurrency sweep)."""
    if spec.engine == "embedded":
        argv = [sys.executable, "-m", "workflow_scripts.engine.launch_server"]
    elif spec.engine == "sglang":
        argv = [spec.sglang_python, "-m", "sglang.launch_server"]
    else:
        raise ValueError(f"engine: unknown engine {spec.engine!r}; allowed: embedded, sglang")
    argv += ["--model-path", spec.model_path, "--host", spec.host, "--port", str(port)]
    argv += ["--random-seed", str(spec.random_seed)]
    argv += ["--max-running-requests", str(setting.get("max_running_requests") or spec.max_running_requests)]
    algorithm = setting.get("speculative_algorithm")
    if algorithm:
        for key in SPEC_KEYS:
            if setting.get(key) is not None:
                argv += [_flag(key), str(setting[key])]
        if algorithm in ALGORITHMS_WITH_DRAFT:
            draft = setting.get("speculative_draft_model_path") or spec.draft_path
            if not draft:
                raise SettingError(f"speculative_draft_model_path: {algorithm} needs a draft model and none is configured")
            argv += ["--speculative-draft-model-path", draft]
    if spec.engine == "embedded" and spec.num_threads:
        argv += ["--num-threads", str(spec.num_threads)]
    if spec.engine == "sglang":
        argv += ["--tp-size", str(spec.tp_size)]
        if spec.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    return argv + list(setting.get("extra_args") or [])
