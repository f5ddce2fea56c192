"""Malformed requests get a 400 naming the field, and the server keeps serving everyone else."""

from __future__ import annotations

import json

import pytest

OK = {"text": "x = 1", "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}


def _with_sampling(**params) -> dict:
    return {"text": "x = 1", "sampling_params": params}


GENERATE_CASES = [
    (b'{"text":', "body"),
    (b"[1, 2]", "body"),
    ({}, "text"),
    ({"text": "a", "input_ids": [1]}, "text"),
    ({"text": 5}, "text"),
    ({"text": ""}, "text"),
    ({"text": ["a", ""]}, "text.1"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, 10**6]}, "input_ids"),
    ({"input_ids": [1, "a"]}, "input_ids.1"),
    ({"input_ids": [1] * 300}, "input_ids"),  # the server runs with --context-length 256
    ({"text": "a", "stream": "yes"}, "stream"),
    ({"text": "a", "rid": 5}, "rid"),
    ({"text": "a", "return_logprob": True}, "return_logprob"),
    ({"text": "a", "sampling_params": "greedy"}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    (_with_sampling(max_new_tokens=-1), "sampling_params.max_new_tokens"),
    (_with_sampling(max_new_tokens=10**6), "sampling_params.max_new_tokens"),
    (_with_sampling(max_new_tokens="5"), "sampling_params.max_new_tokens"),
    (_with_sampling(max_new_tokens=2.5), "sampling_params.max_new_tokens"),
    (_with_sampling(temperature=-1), "sampling_params.temperature"),
    (_with_sampling(top_p=0), "sampling_params.top_p"),
    (_with_sampling(top_k=0), "sampling_params.top_k"),
    (_with_sampling(ignore_eos=1), "sampling_params.ignore_eos"),
    (_with_sampling(stop=""), "sampling_params.stop"),
    (_with_sampling(stop=[1]), "sampling_params.stop"),
    (_with_sampling(stop_token_ids=[10**6]), "sampling_params.stop_token_ids"),
    (_with_sampling(frequency_penalty=0.5), "sampling_params.frequency_penalty"),
    (_with_sampling(bogus=1), "sampling_params.bogus"),
]

COMPLETION_CASES = [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "a", "max_tokens": 10**6}, "max_tokens"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": "a", "n": 2}, "n"),
    ({"prompt": "a", "min_tokens": 3}, "min_tokens"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "a", "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
]


def _post(server, path: str, body) -> dict:
    resp = server.post(path, body if isinstance(body, bytes) else json.dumps(body).encode())
    assert resp.status_code == 400, (body, resp.status_code, resp.text)
    return resp.json()["error"]


@pytest.mark.parametrize(("body", "field"), GENERATE_CASES, ids=[c[1] for c in GENERATE_CASES])
def test_generate_refuses_naming_the_field(plain_server, body, field):
    error = _post(plain_server, "/generate", body)
    assert error["param"] == field, error
    assert field in error["message"]


@pytest.mark.parametrize(("body", "field"), COMPLETION_CASES, ids=[c[1] for c in COMPLETION_CASES])
def test_completions_refuse_naming_the_field(plain_server, body, field):
    error = _post(plain_server, "/v1/completions", body)
    assert error["param"] == field, error


def test_bad_stream_request_is_refused_before_streaming(plain_server):
    resp = plain_server.post("/generate", {"text": "a", "stream": True, "sampling_params": {"top_k": -5}})
    assert resp.status_code == 400
    assert resp.headers["content-type"].startswith("application/json")


def test_unknown_top_level_fields_are_ignored_like_sglang(plain_server):
    # bench_serving sends lora_path, return_logprob, logprob_start_len, ... alongside the prompt.
    body = {**OK, "lora_path": None, "return_logprob": False, "logprob_start_len": -1, "some_future_field": {}}
    assert plain_server.post("/generate", body).status_code == 200


def test_server_keeps_serving_after_bad_requests(plain_server):
    for body, _ in GENERATE_CASES:
        plain_server.post("/generate", body if isinstance(body, bytes) else json.dumps(body).encode())
    out = plain_server.post("/generate", OK).json()
    assert out["meta_info"]["completion_tokens"] == 4
    assert plain_server.get("/health_generate").status_code == 200
