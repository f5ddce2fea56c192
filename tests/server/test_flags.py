"""Bad flags and model directories: a non-zero exit and one line on stderr naming the flag or path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_scripts.server.server_args import parse_server_args
from workflow_scripts.engine.types import DEFAULT_CHUNKED_PREFILL_SIZE


REPO_ROOT = Path(__file__).resolve().parents[2]


def _launch(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workflow_scripts.engine.launch_server", "--port", "1", *flags],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=None if env is None else os.environ | env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def broken_dirs(tmp_path_factory, tiny_models) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken")
    bad_json = root / "bad_json"
    shutil.copytree(tiny_models["target"], bad_json)
    (bad_json / "config.json").write_text("{not json")
    no_weights = root / "no_weights"
    shutil.copytree(tiny_models["target"], no_weights)
    (no_weights / "model.safetensors").unlink()
    no_tokenizer = root / "no_tokenizer"
    shutil.copytree(tiny_models["target"], no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    bad_arch = root / "bad_arch"  # passes flag checks, refused by the engine itself
    shutil.copytree(tiny_models["target"], bad_arch)
    config = (bad_arch / "config.json").read_text().replace("Qwen3MoeForCausalLM", "LlamaForCausalLM")
    (bad_arch / "config.json").write_text(config)
    return {"bad_json": bad_json, "no_weights": no_weights, "no_tokenizer": no_tokenizer, "bad_arch": bad_arch}


SPEC_CASES = {
    "unknown flag": (["--bogus-flag", "1"], "--bogus-flag"),
    "stream interval 0": (["--stream-interval", "0"], "--stream-interval"),
    "stream interval not int": (["--stream-interval", "often"], "--stream-interval"),
    "empty api key": (["--api-key", ""], "--api-key"),
    "metrics with a value": (["--enable-metrics=yes"], "--enable-metrics"),
    "incremental with a value": (["--incremental-streaming-output=1"], "--incremental-streaming-output"),
    "bad int": (["--max-running-requests", "many"], "--max-running-requests"),
    "zero slots": (["--max-running-requests", "0"], "--max-running-requests"),
    "unknown algorithm": (["--speculative-algorithm", "EAGLE9"], "--speculative-algorithm"),
    "unsupported dtype": (["--dtype", "float16"], "--dtype"),
    "zero chunk": (["--chunked-prefill-size", "0"], "--chunked-prefill-size"),
    "negative chunk": (["--chunked-prefill-size", "-2"], "--chunked-prefill-size"),
    "chunk not int": (["--chunked-prefill-size", "8k"], "--chunked-prefill-size"),
    "standalone without draft": (["--speculative-algorithm", "STANDALONE"], "--speculative-draft-model-path"),
    "steps without algorithm": (["--speculative-num-steps", "2"], "--speculative-num-steps"),
    "partial spec numbers": (
        ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "2"], "--speculative-eagle-topk"
    ),
    "topk 2": (
        ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
         "--speculative-num-draft-tokens", "3"], "--speculative-eagle-topk",
    ),
    "draft tokens not steps+1": (
        ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "5"], "--speculative-num-draft-tokens",
    ),
    "adaptive config missing": (
        ["--speculative-algorithm", "NGRAM", "--speculative-adaptive", "--speculative-adaptive-config", "/no/such.json"],
        "--speculative-adaptive-config: /no/such.json does not exist",
    ),
    "adaptive start not a tier": (
        ["--speculative-algorithm", "NGRAM", "--speculative-adaptive", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"],
        "--speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]",
    ),
}  # fmt: skip


def _assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", SPEC_CASES, ids=list(SPEC_CASES))
def test_bad_flags(case, tiny_models):
    flags, needle = SPEC_CASES[case]
    _assert_one_line(_launch("--model-path", str(tiny_models["target"]), *flags), needle)


BIND_CASES = {
    "not a core list": "one",
    "a rank per group": "0|1",
    "reversed range": "1-0",
    "a core this process cannot use": str(max(os.sched_getaffinity(0)) + 1),
}


@pytest.mark.parametrize("case", BIND_CASES, ids=list(BIND_CASES))
def test_bad_cpu_binding(case, tiny_models):
    """SGLang's SGLANG_CPU_OMP_THREADS_BIND, refused at start in one line that names it."""
    proc = _launch("--model-path", str(tiny_models["target"]), env={"SGLANG_CPU_OMP_THREADS_BIND": BIND_CASES[case]})
    _assert_one_line(proc, "SGLANG_CPU_OMP_THREADS_BIND")


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "nowhere"
    _assert_one_line(_launch("--model-path", str(missing)), "--model-path", str(missing))


@pytest.mark.parametrize("name", ["bad_json", "no_weights", "no_tokenizer", "bad_arch"])
def test_malformed_model_dir(broken_dirs, name):
    _assert_one_line(_launch("--model-path", str(broken_dirs[name])), str(broken_dirs[name]))


def test_draft_with_other_vocabulary(tiny_models):
    proc = _launch(
        "--model-path", str(tiny_models["target"]), "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(tiny_models["draft_bad_vocab"]),
    )  # fmt: skip
    _assert_one_line(proc, "--speculative-draft-model-path", "vocab_size")


def test_speculation_defaults_follow_sglang(tiny_models):
    args = parse_server_args(
        ["--model-path", str(tiny_models["target"]), "--speculative-algorithm", "STANDALONE",
         "--speculative-draft-model-path", str(tiny_models["draft"])]
    )  # fmt: skip
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    plain = parse_server_args(["--model-path", str(tiny_models["target"])])
    assert plain.spec_config() is None and plain.tokenizer_path == str(tiny_models["target"])


def test_chunked_prefill_flags_follow_sglang(tiny_models):
    model = ["--model-path", str(tiny_models["target"])]
    plain = parse_server_args(model)
    assert (plain.chunked_prefill_size, plain.enable_mixed_chunk) == (DEFAULT_CHUNKED_PREFILL_SIZE, False)
    mixed = parse_server_args([*model, "--chunked-prefill-size", "-1", "--enable-mixed-chunk"])
    assert (mixed.chunked_prefill_size, mixed.enable_mixed_chunk) == (-1, True)  # -1: chunking off, as in SGLang


def test_adaptive_follows_sglang(tiny_models, tmp_path):
    """SGLang's `_init_adaptive_speculative_params`: without steps, the middle tier of the config's union; draft tokens
    follow; the engine gets the config itself."""
    config = tmp_path / "adaptive.json"
    config.write_text('{"1": {"candidate_steps": [1, 2]}, "8": {"candidate_steps": [0, 4]}}')
    args = parse_server_args(
        ["--model-path", str(tiny_models["target"]), "--speculative-algorithm", "STANDALONE",
         "--speculative-draft-model-path", str(tiny_models["draft"]), "--speculative-adaptive",
         "--speculative-adaptive-config", str(config)]
    )  # fmt: skip
    assert (args.speculative_num_steps, args.speculative_num_draft_tokens) == (2, 3)
    assert args.spec_config().adaptive_config == {"1": {"candidate_steps": [1, 2]}, "8": {"candidate_steps": [0, 4]}}
