"""Command-line flags of the embedded server, with SGLang's names, defaults and speculation rules.

Kept free of torch imports so that a bad flag or model directory fails in well under a second, with one line
that names the flag or path at fault.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from workflow_scripts.engine.adaptive import candidate_steps, initial_steps, load_adaptive_config
from workflow_scripts.engine.torch_setup import engine_threads
from workflow_scripts.engine.types import (
    DEFAULT_CHUNKED_PREFILL_SIZE, EngineConfigError, SpecConfig, chunked_prefill_problem,
)  # fmt: skip
from workflow_scripts.server.cpu_binding import CpuBindingError, engine_cpus
from workflow_scripts.speculation_rules import speculation_problem

SPEC_ALGORITHMS = ("STANDALONE", "NGRAM")
# SGLang's `_auto_choose_speculative_params` answers (steps 3, topk 1, draft tokens 4) for STANDALONE and for
# every architecture it does not list, which includes Qwen3-MoE. NGRAM in SGLang defaults to a 12-token tree;
# our NGRAM proposes a chain (topk 1), so it takes the same chain defaults as STANDALONE.
DEFAULT_SPEC_STEPS, DEFAULT_SPEC_TOPK, DEFAULT_SPEC_DRAFT_TOKENS = 3, 1, 4
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
REDACTED = "<redacted>"


class ServerArgsError(ValueError):
    """A flag or model directory the server refuses; the message is one line naming the flag or path."""


@dataclass(frozen=True)
class ServerArgs:
    """Resolved server settings; `/server_info` reports them under SGLang's field names."""

    model_path: str
    tokenizer_path: str
    served_model_name: str
    host: str
    port: int
    max_running_requests: int
    random_seed: int
    log_level: str
    context_length: int | None
    num_threads: int | None
    dtype: str
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    chunked_prefill_size: int
    enable_mixed_chunk: bool
    incremental_streaming_output: bool = False
    stream_interval: int = 1
    enable_metrics: bool = False
    enable_in_engine_bench: bool = False
    api_key: str | None = None
    engine_cpus: tuple[int, ...] | None = None  # SGLANG_CPU_OMP_THREADS_BIND (server/cpu_binding.py)
    speculative_adaptive: bool = False  # SGLang's adaptive step tiers (engine/adaptive.py)
    speculative_adaptive_config: str | None = None  # its JSON file; None = SGLang's default tiers

    def spec_config(self) -> SpecConfig | None:
        """The engine's view of the speculation flags (None when not speculating)."""
        if self.speculative_algorithm is None:
            return None
        return SpecConfig(
            algorithm=self.speculative_algorithm,
            num_steps=self.speculative_num_steps,
            eagle_topk=self.speculative_eagle_topk,
            num_draft_tokens=self.speculative_num_draft_tokens,
            draft_model_path=Path(self.speculative_draft_model_path) if self.speculative_draft_model_path else None,
            adaptive_config=load_adaptive_config(self.speculative_adaptive_config) if self.speculative_adaptive else None,
        )

    def to_dict(self) -> dict:
        """The settings to report and log; the API key itself is never shown."""
        return {**asdict(self), "api_key": REDACTED if self.api_key else None}


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error and exits 2; we want the error alone, raised, as one line."""

    def error(self, message: str) -> NoReturn:
        raise ServerArgsError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="python -m workflow_scripts.engine.launch_server",
        description="Embedded CPU engine behind SGLang's HTTP API (SGLang's flag names and meanings).",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", required=True, help="HF-format model dir (config.json, *.safetensors)")
    p.add_argument("--tokenizer-path", default=None, help="dir with tokenizer.json (default: --model-path)")
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (default: --model-path)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--random-seed", type=int, default=None, help="default: a random seed, reported by /server_info")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.add_argument("--context-length", type=int, default=None, help="default: the model's max_position_embeddings")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch intra-op threads (ours, not SGLang's); default $SPECSTUDY_ENGINE_THREADS, else 1")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weights and activations; auto = config.json's torch_dtype (float32 for the built pair)")
    p.add_argument("--speculative-algorithm", default=None, choices=SPEC_ALGORITHMS)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-adaptive", action="store_true",
                   help="switch --speculative-num-steps among step tiers at run time from a moving average of acceptance")
    p.add_argument("--speculative-adaptive-config", default=None,
                   help="JSON file of the tiers per batch size and the rule's knobs (default: SGLang's own tiers)")
    p.add_argument("--chunked-prefill-size", type=int, default=None,
                   help=f"max prompt tokens prefilled per forward; -1 disables chunking (default {DEFAULT_CHUNKED_PREFILL_SIZE})")
    p.add_argument("--enable-mixed-chunk", action="store_true",
                   help="prefill chunks of new requests join the running decode batch in one forward")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="streamed /generate chunks carry only the new text and output_ids (default: cumulative)")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="streamed chunks come every N new tokens (and at the end); a request's own "
                        "sampling_params.stream_interval wins")
    p.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    p.add_argument("--enable-in-engine-bench", action="store_true",
                   help="serve POST /in_engine_bench: a closed-loop cell run on this server's own engine, no HTTP "
                        "per request (benchmarks/client_overhead.py; not an SGLang flag)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health (SGLang's rule)")
    return p


def read_model_config(path: str, flag: str) -> dict:
    """config.json of a model dir, or a one-line error naming the flag and the path."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise ServerArgsError(f"{flag}: {path} is not a directory")
    config_file = model_dir / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ServerArgsError(f"{flag}: {config_file} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ServerArgsError(f"{flag}: {config_file} is not valid JSON ({err})") from None
    if not isinstance(config, dict) or not isinstance(config.get("vocab_size"), int):
        raise ServerArgsError(f"{flag}: {config_file} has no integer vocab_size")
    if not any(model_dir.glob("*.safetensors")):
        raise ServerArgsError(f"{flag}: {path} holds no *.safetensors weights")
    return config


def _check_positive(ns: argparse.Namespace, name: str, minimum: int = 1) -> None:
    value = getattr(ns, name)
    if value is not None and value < minimum:
        raise ServerArgsError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def _resolve_speculation(ns: argparse.Namespace) -> tuple[int | None, int | None, int | None]:
    """SGLang's rules: all three numbers or none (then defaults), topk 1 only here, draft tokens = steps + 1."""
    steps, topk, draft_tokens = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    problem = speculation_problem(ns.speculative_algorithm, vars(ns), ns.speculative_draft_model_path)
    if problem:
        raise ServerArgsError(problem)
    if ns.speculative_algorithm is None:
        return None, None, None
    if ns.speculative_algorithm == "STANDALONE" and not ns.speculative_draft_model_path:
        raise ServerArgsError("--speculative-draft-model-path is required with --speculative-algorithm STANDALONE")
    if ns.speculative_algorithm == "NGRAM" and ns.speculative_draft_model_path:
        raise ServerArgsError("--speculative-draft-model-path must not be set with --speculative-algorithm NGRAM")
    if ns.speculative_adaptive:
        return _resolve_adaptive(ns)
    if steps is None:
        return DEFAULT_SPEC_STEPS, DEFAULT_SPEC_TOPK, DEFAULT_SPEC_DRAFT_TOKENS
    if steps < 1:
        raise ServerArgsError(f"--speculative-num-steps must be >= 1, got {steps}")
    if topk != 1:
        raise ServerArgsError(f"--speculative-eagle-topk {topk} is not supported by the embedded engine (only 1)")
    return steps, topk, draft_tokens


def _resolve_adaptive(ns: argparse.Namespace) -> tuple[int, int, int]:
    """SGLang's `_init_adaptive_speculative_params`: the starting steps must be a tier (the middle tier when unset),
    topk 1, and draft tokens follow the steps."""
    flag = "--speculative-adaptive-config"
    try:
        cfg = load_adaptive_config(ns.speculative_adaptive_config)
        candidate_steps(cfg)
    except FileNotFoundError:
        raise ServerArgsError(f"{flag}: {ns.speculative_adaptive_config} does not exist") from None
    except (ValueError, AttributeError, TypeError) as err:
        raise ServerArgsError(f"{flag}: {ns.speculative_adaptive_config}: {err}") from None
    if ns.speculative_eagle_topk not in (None, 1):
        raise ServerArgsError(f"--speculative-eagle-topk {ns.speculative_eagle_topk} is not supported with "
                              "--speculative-adaptive (only 1, as in SGLang)")
    try:
        steps = initial_steps(cfg, ns.speculative_num_steps)
    except ValueError as err:
        raise ServerArgsError(str(err)) from None
    return steps, 1, steps + 1


def parse_server_args(argv: Sequence[str]) -> ServerArgs:
    """Parse and validate flags and model dirs; raises ServerArgsError with a one-line reason."""
    ns = build_parser().parse_args(list(argv))
    for name in ("max_running_requests", "num_threads", "stream_interval"):
        _check_positive(ns, name)
    try:
        engine_threads(ns.num_threads)  # $SPECSTUDY_ENGINE_THREADS, when no --num-threads: refused here, by name
    except EngineConfigError as err:
        raise ServerArgsError(str(err)) from None
    if ns.api_key is not None and not ns.api_key.strip():
        raise ServerArgsError("--api-key must not be empty")
    _check_positive(ns, "context_length", minimum=2)
    if ns.chunked_prefill_size is not None and (problem := chunked_prefill_problem(ns.chunked_prefill_size)):
        raise ServerArgsError(problem)
    if not 1 <= ns.port <= 65535:
        raise ServerArgsError(f"--port must be in 1..65535, got {ns.port}")
    steps, topk, draft_tokens = _resolve_speculation(ns)
    try:
        cpus = engine_cpus()
    except CpuBindingError as err:
        raise ServerArgsError(str(err)) from None
    target = read_model_config(ns.model_path, "--model-path")
    tokenizer_path = ns.tokenizer_path or ns.model_path
    tokenizer_file = Path(tokenizer_path) / "tokenizer.json"
    if not tokenizer_file.is_file():
        flag = "--tokenizer-path" if ns.tokenizer_path else "--model-path"
        raise ServerArgsError(f"{flag}: {tokenizer_file} is missing")
    if ns.speculative_draft_model_path:
        draft = read_model_config(ns.speculative_draft_model_path, "--speculative-draft-model-path")
        if draft["vocab_size"] != target["vocab_size"]:
            raise ServerArgsError(
                f"--speculative-draft-model-path: {ns.speculative_draft_model_path} has vocab_size "
                f"{draft['vocab_size']}, the target {ns.model_path} has {target['vocab_size']}"
            )
    return ServerArgs(
        model_path=ns.model_path,
        tokenizer_path=tokenizer_path,
        served_model_name=ns.served_model_name or ns.model_path,
        host=ns.host,
        port=ns.port,
        max_running_requests=ns.max_running_requests,
        random_seed=ns.random_seed if ns.random_seed is not None else random.randrange(2**30),
        log_level=ns.log_level,
        context_length=ns.context_length,
        num_threads=ns.num_threads,
        dtype=ns.dtype,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft_tokens,
        chunked_prefill_size=DEFAULT_CHUNKED_PREFILL_SIZE if ns.chunked_prefill_size is None else ns.chunked_prefill_size,
        enable_mixed_chunk=ns.enable_mixed_chunk,
        incremental_streaming_output=ns.incremental_streaming_output,
        stream_interval=ns.stream_interval,
        enable_metrics=ns.enable_metrics,
        enable_in_engine_bench=ns.enable_in_engine_bench,
        api_key=ns.api_key,
        engine_cpus=tuple(sorted(cpus)) if cpus else None,
        speculative_adaptive=ns.speculative_adaptive and ns.speculative_algorithm is not None,
        speculative_adaptive_config=ns.speculative_adaptive_config,
    )
