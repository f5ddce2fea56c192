"""Server command lines built from settings, for both engines."""

from __future__ import annotations

import sys

import pytest

from workflow_scripts.launcher.command import (
    ServerSpec, SettingError, build_command, check_setting, server_api_key, setting_env,
)
from workflow_scripts.launcher.process import shown_command

STEPS2 = {
    "speculative_algorithm": "STANDALONE",
    "speculative_num_steps": 2,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
    "extra_args": ["--log-level", "debug"],
}


def flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def test_embedded_command_speaks_sglang_flags():
    spec = ServerSpec("embedded", "/m/target", "/m/draft", "127.0.0.1", 64, 7, num_threads=2)
    argv = build_command(spec, STEPS2, port=31000)
    assert argv[:3] == [sys.executable, "-m", "workflow_scripts.engine.launch_server"]
    f = flags(argv)
    assert f["--model-path"] == "/m/target" and f["--port"] == "31000" and f["--random-seed"] == "7"
    assert f["--speculative-algorithm"] == "STANDALONE" and f["--speculative-num-steps"] == "2"
    assert f["--speculative-eagle-topk"] == "1" and f["--speculative-num-draft-tokens"] == "3"
    assert f["--speculative-draft-model-path"] == "/m/draft"
    assert f["--max-running-requests"] == "64" and f["--num-threads"] == "2"
    assert argv[-2:] == ["--log-level", "debug"]
    assert "--tp-size" not in f


def test_sglang_command_sets_tp_mem_fraction_and_always_max_running_requests():
    spec = ServerSpec("sglang", "/ckpt/qwen", "/ckpt/eagle", "0.0.0.0", 32, 0, sglang_python="/opt/sg/bin/python",
                      tp_size=4, mem_fraction_static=0.85)
    setting = dict(STEPS2, speculative_algorithm="EAGLE", max_running_requests=16, extra_args=[])
    argv = build_command(spec, setting, port=30000)
    assert argv[:3] == ["/opt/sg/bin/python", "-m", "sglang.launch_server"]
    f = flags(argv)
    assert f["--tp-size"] == "4" and f["--mem-fraction-static"] == "0.85"
    assert f["--max-running-requests"] == "16"  # the setting's own value wins over the server default
    assert f["--speculative-draft-model-path"] == "/ckpt/eagle"


def test_ngram_needs_no_draft_and_baseline_has_no_speculation():
    spec = ServerSpec("embedded", "/m/target", "/m/draft", "127.0.0.1", 8, 0)
    ngram = build_command(spec, dict(STEPS2, speculative_algorithm="NGRAM", extra_args=[]), port=1)
    assert "--speculative-draft-model-path" not in ngram and flags(ngram)["--speculative-algorithm"] == "NGRAM"
    baseline = build_command(spec, {}, port=1)
    assert not any(a.startswith("--speculative") for a in baseline)


def test_draft_algorithm_without_any_draft_is_refused():
    spec = ServerSpec("sglang", "/ckpt/qwen", None, "127.0.0.1", 8, 0)
    with pytest.raises(SettingError, match="speculative_draft_model_path"):
        build_command(spec, STEPS2, port=1)


@pytest.mark.parametrize(
    "setting,message",
    [
        ({"speculative_algorithm": "STANDALONE", "speculative_num_steps": 2}, "together or not at all"),
        (dict(STEPS2, speculative_num_draft_tokens=4), "must be speculative_num_steps \\+ 1 = 3"),
        ({"speculative_eagle_topk": 1}, "speculative_eagle_topk is set but speculative_algorithm is not"),
        ({"bogus": 1}, "unknown key"),
    ],
)
def test_check_setting_names_the_setting_and_key(setting, message):
    with pytest.raises(SettingError, match=message) as err:
        check_setting("s1", setting)
    assert "settings.s1" in str(err.value)


def test_check_setting_accepts_algorithm_alone_and_topk_above_one():
    check_setting("a", {"speculative_algorithm": "NGRAM"})
    check_setting("b", dict(STEPS2, speculative_eagle_topk=4, speculative_num_draft_tokens=8))


def test_streaming_metrics_and_api_key_flags():
    spec = ServerSpec("embedded", "/m/target", None, "0.0.0.0", 8, 0, incremental_streaming=True,
                      api_key="k3y")  # fmt: skip
    argv = build_command(spec, {}, port=1)
    assert "--incremental-streaming-output" in argv and "--enable-metrics" in argv
    assert argv[argv.index("--api-key") + 1] == "k3y"
    plain = build_command(ServerSpec("sglang", "/ckpt", None, "127.0.0.1", 8, 0), {}, port=1)
    assert "--enable-metrics" in plain  # SGLang's own flag: its /metrics is scraped the same way
    assert "--incremental-streaming-output" not in plain and "--api-key" not in plain


def test_api_key_only_beyond_loopback():
    assert server_api_key("127.0.0.1") is None
    first, second = server_api_key("0.0.0.0"), server_api_key("10.1.2.3")
    assert first and second and first != second and len(first) >= 24


def test_logged_command_hides_the_api_key():
    shown = shown_command(["python", "-m", "x", "--api-key", "s3cret", "--port", "1"])
    assert "s3cret" not in shown and "--api-key <redacted> --port 1" in shown


def test_adaptive_flags_pass_to_sglang_unchanged(tmp_path):
    config = tmp_path / "c.json"
    config.write_text('{"1": {"candidate_steps": [1, 3]}, "16": {"candidate_steps": [0, 1]}}')
    setting = {"speculative_algorithm": "EAGLE", "speculative_adaptive": True, "speculative_adaptive_config": str(config)}
    check_setting("adaptive", setting, "sglang")
    argv = build_command(ServerSpec("sglang", "/ckpt/qwen", "/ckpt/eagle", "127.0.0.1", 32, 0), setting, port=30000)
    at = argv.index("--speculative-adaptive")
    assert argv[at + 1: at + 3] == ["--speculative-adaptive-config", str(config)]


def test_a_calibration_setting_sets_sglangs_simulation_switch():
    assert setting_env({**STEPS2, "simulate_acc_len": 2.5}) == {
        "SGLANG_SIMULATE_ACC_LEN": "2.5", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
    assert setting_env(STEPS2) == {"SGLANG_SIMULATE_ACC_LEN": None, "SGLANG_SIMULATE_ACC_TOKEN_MODE": None}
    with pytest.raises(SettingError, match="settings.b.simulate_acc_len: fixes the acceptance of a speculative"):
        check_setting("b", {"simulate_acc_len": 2})
