"""Turn a study setting into a server command line.

A setting holds SGLang's server flags with dashes as underscores, so the same setting drives real SGLang
(`python -m sglang.launch_server`) and the embedded engine (`python -m workflow_scripts.engine.launch_server`),
which accepts the same flag names. Only this module and `process.py` know which engine is behind the URL.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from workflow_scripts.engine.adaptive import (
    DEFAULT_ADAPTIVE_CONFIG, adaptive_unsupported_reason, batch_entries, candidate_steps,
)  # fmt: skip
from workflow_scripts.speculation_rules import NUMBER_KEYS, as_flag, speculation_problem

# Setting keys that become server flags, in the order SGLang's docs list them.
SPEC_KEYS = ("speculative_algorithm", *NUMBER_KEYS)
# SGLang's adaptive speculation flags: a switch and the path of its JSON config, passed as they are.
ADAPTIVE_KEYS = ("speculative_adaptive", "speculative_adaptive_config")
MAX_STEPS = 16  # config/schema.yaml's speculative_num_steps maximum: the highest tier a config may name
# Setting keys that are study-side, not server flags.
STUDY_KEYS = ("moe_config", "workloads", "extra_args", "speculative_draft_model_path", "max_running_requests",
              "simulate_acc_len")
# a calibration setting's fixed acceptance (analysis/calibration.py) reaches the server as SGLang's environment switch,
# with the draft's real tokens committed (SGLang's default commits id 100 everywhere, which routes every position of
# an MoE verify to the same experts and so measures a cheaper step than real text costs)
SIMULATE_ENV = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_TOKEN_MODE")
ALGORITHMS_WITH_DRAFT = ("STANDALONE", "EAGLE", "EAGLE3")
LOOPBACK = "127.0.0.1"


class SettingError(ValueError):
    """A setting whose speculation flags SGLang would refuse; the message names the setting and the key."""


def check_setting(name: str, setting: dict, engine: str = "embedded") -> None:
    """Apply SGLang's speculation-flag rules (workflow_scripts.speculation_rules) before any server starts."""
    allowed = SPEC_KEYS + ADAPTIVE_KEYS + STUDY_KEYS
    unknown = set(setting) - set(allowed)
    if unknown:
        raise SettingError(f"settings.{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    problem = speculation_problem(
        setting.get("speculative_algorithm"), setting, setting.get("speculative_draft_model_path"), name=str
    )
    if problem:
        raise SettingError(f"settings.{name}: {problem}")
    if setting.get("simulate_acc_len") is not None and not setting.get("speculative_algorithm"):
        raise SettingError(f"settings.{name}.simulate_acc_len: fixes the acceptance of a speculative setting; "
                           "set speculative_algorithm too")
    if problem := adaptive_problem(setting, engine):
        raise SettingError(f"settings.{name}.{problem}")


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a batch-size key appears twice ({sorted(k for k in set(keys) if keys.count(k) > 1)})")
    return dict(pairs)


def read_adaptive_config(path: str) -> dict:
    """An adaptive config as a study may use it: SGLang's rules, plus batch-size keys in increasing order with no
    key twice (SGLang sorts them and keeps the last of two silently, which would hide a mistyped schedule)."""
    cfg = json.loads(Path(path).read_text(), object_pairs_hook=_no_duplicate_keys)
    if not isinstance(cfg, dict):
        raise ValueError("must be a JSON object of batch-size keys")
    sizes = list(batch_entries(cfg))
    if sizes != sorted(sizes):
        raise ValueError(f"batch-size keys must be in increasing order, got {sizes}")
    return cfg


def adaptive_problem(setting: dict, engine: str) -> str | None:
    """What SGLang (or, for the embedded engine, our engine) would refuse or silently ignore in the adaptive keys,
    as `key: reason`."""
    path = setting.get("speculative_adaptive_config")
    if not setting.get("speculative_adaptive"):
        return "speculative_adaptive_config: set but speculative_adaptive is not (SGLang would ignore it)" if path else None
    algorithm, topk = setting.get("speculative_algorithm"), setting.get("speculative_eagle_topk")
    if algorithm is None:
        return "speculative_adaptive: needs speculative_algorithm"
    if topk not in (None, 1):
        return f"speculative_eagle_topk: {topk} with speculative_adaptive; SGLang adapts topk 1 only"
    if engine == "sglang" and (reason := adaptive_unsupported_reason(algorithm, topk)):
        return f"speculative_algorithm: SGLang 0.5.23 does not adapt {reason} and would run static steps"
    try:
        tiers = candidate_steps(DEFAULT_ADAPTIVE_CONFIG if path is None else read_adaptive_config(path))
    except FileNotFoundError:
        return f"speculative_adaptive_config: {path} does not exist"
    except (ValueError, AttributeError, TypeError) as err:
        return f"speculative_adaptive_config: {path}: {err}"
    if tiers[-1] > MAX_STEPS:
        return f"speculative_adaptive_config: tier {tiers[-1]} is above speculative_num_steps' maximum {MAX_STEPS}"
    steps = setting.get("speculative_num_steps")
    if steps is not None and steps not in tiers:
        return f"speculative_num_steps: {steps} is not one of the adaptive tiers {tiers} (SGLang refuses it)"
    return None


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
    incremental_streaming: bool = False  # --incremental-streaming-output: /generate streams deltas
    enable_metrics: bool = True  # --enable-metrics: Prometheus /metrics, scraped around each cell
    api_key: str | None = None  # --api-key: see server_api_key()


def setting_env(setting: dict) -> dict[str, str | None]:
    """The server environment a setting asks for: its fixed acceptance, or none (None removes an inherited one)."""
    value = setting.get("simulate_acc_len")
    return dict(zip(SIMULATE_ENV, (str(value), "real-draft-token") if value is not None else (None, None)))


def server_api_key(host: str) -> str | None:
    """A fresh key for a server reachable beyond loopback (`server.host` not 127.0.0.1), None for a loopback one.

    Fresh per launch: it protects the server while it runs and is never stored in a plan, a log or a result."""
    return None if host == LOOPBACK else secrets.token_urlsafe(24)


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
                argv += [as_flag(key), str(setting[key])]
        if algorithm in ALGORITHMS_WITH_DRAFT:
            draft = setting.get("speculative_draft_model_path") or spec.draft_path
            if not draft:
                raise SettingError(f"speculative_draft_model_path: {algorithm} needs a draft model and none is configured")
            argv += ["--speculative-draft-model-path", draft]
        if setting.get("speculative_adaptive"):
            argv.append("--speculative-adaptive")
            if setting.get("speculative_adaptive_config"):
                argv += ["--speculative-adaptive-config", str(setting["speculative_adaptive_config"])]
    if spec.incremental_streaming:
        argv.append("--incremental-streaming-output")
    if spec.enable_metrics:
        argv.append("--enable-metrics")
    if spec.api_key:
        argv += ["--api-key", spec.api_key]
    if spec.engine == "embedded" and spec.num_threads:
        argv += ["--num-threads", str(spec.num_threads)]
    if spec.engine == "sglang":
        argv += ["--tp-size", str(spec.tp_size)]
        if spec.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    return argv + list(setting.get("extra_args") or [])
