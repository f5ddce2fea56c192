"""Speculating servers report SGLang's spec_* meta_info fields and stay lossless at temperature 0."""

from __future__ import annotations

import json

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
PROMPTS = ["def f(x):", "import sys\n", "class Point:"]


@pytest.fixture(scope="module")
def standalone_server(start_server, tiny_models):
    return start_server(
        tiny_models["target"],
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(tiny_models["draft"]),
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
    )  # fmt: skip


@pytest.fixture(scope="module")
def ngram_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--speculative-algorithm", "NGRAM")


def _check_spec_meta(meta: dict, steps: int) -> None:
    """SGLang's meaning: histogram[i] = verifies that accepted exactly i drafts (no bonus token), proposed = verifies
    x (num_draft_tokens - 1), so the histogram sums to spec_verify_ct and its weighted sum is the correct drafts."""
    verify = meta["spec_verify_ct"]
    assert verify > 0
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / verify)
    histogram = meta["spec_correct_drafts_histogram"]
    assert 1 <= len(histogram) <= steps + 1 and histogram[-1] > 0 and min(histogram) >= 0
    assert sum(histogram) == verify
    assert sum(i * n for i, n in enumerate(histogram)) == meta["spec_num_correct_drafts"]
    assert meta["spec_num_proposed_drafts"] == verify * steps
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / (verify * steps))
    # the prefill's token, then per verify its correct drafts + the bonus token (all of them unless the cap cut)
    assert meta["completion_tokens"] <= 1 + meta["spec_num_correct_drafts"] + verify
    assert (meta["spec_accepted_drafts"], meta["spec_proposed_drafts"], meta["spec_accept_histogram"]) == (
        meta["spec_num_correct_drafts"], meta["spec_num_proposed_drafts"], histogram)


def test_standalone_meta_info_and_lossless(standalone_server, plain_server):
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": GREEDY}
        spec = standalone_server.post("/generate", body).json()
        plain = plain_server.post("/generate", body).json()
        assert spec["output_ids"] == plain["output_ids"]
        _check_spec_meta(spec["meta_info"], steps=2)


def test_standalone_stream_final_chunk_has_spec_fields(standalone_server):
    body = {"text": PROMPTS[0], "stream": True, "sampling_params": GREEDY}
    chunks = [json.loads(p) for p in standalone_server.stream("/generate", body)[:-1]]
    _check_spec_meta(chunks[-1]["meta_info"], steps=2)
    assert all("spec_verify_ct" not in c["meta_info"] for c in chunks[:-1])


def test_standalone_server_info(standalone_server, tiny_models):
    standalone_server.post("/generate", {"text": PROMPTS[1], "sampling_params": GREEDY})
    info = standalone_server.get("/server_info").json()
    assert info["speculative_algorithm"] == "STANDALONE"
    assert info["speculative_draft_model_path"] == str(tiny_models["draft"])
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        2,
        1,
        3,
    )
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0


def test_ngram_takes_sglang_chain_defaults_and_reports_spec_fields(ngram_server, plain_server):
    info = ngram_server.get("/server_info").json()
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        3,
        1,
        4,
    )
    body = {"text": PROMPTS[2], "sampling_params": GREEDY}
    out = ngram_server.post("/generate", body).json()
    assert out["output_ids"] == plain_server.post("/generate", body).json()["output_ids"]
    _check_spec_meta(out["meta_info"], steps=3)


def test_adaptive_server_switches_tiers_and_stays_lossless(start_server, tiny_models, plain_server, tmp_path):
    """--speculative-adaptive through the real server and engine process: the config reaches the engine (its tier
    switches are counted in /server_info), and greedy output stays the plain server's."""
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"warmup_batches": 1, "update_interval": 1, "1": {"candidate_steps": [0, 1, 2]}}))
    server = start_server(
        tiny_models["target"], "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(tiny_models["draft"]), "--speculative-adaptive",
        "--speculative-adaptive-config", str(config), "--max-running-requests", "1",
    )  # fmt: skip
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": {**GREEDY, "max_new_tokens": 48}}
        assert server.post("/generate", body).json()["text"] == plain_server.post("/generate", body).json()["text"]
    info = server.get("/server_info").json()
    assert info["speculative_adaptive"] is True and info["speculative_num_steps"] == 1
    assert info["internal_states"][0]["total_adaptive_switches"] > 0
