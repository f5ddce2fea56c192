"""Every endpoint of the real server, with the payloads and field names SGLang's clients read."""

from __future__ import annotations

import asyncio
import json

import aiohttp

GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def test_health_endpoints(plain_server):
    assert plain_server.get("/health").status_code == 200
    assert plain_server.get("/health_generate").status_code == 200


def test_server_info_and_alias(plain_server, tiny_models):
    for path in ("/server_info", "/get_server_info"):
        info = plain_server.get(path).json()
        assert info["model_path"] == str(tiny_models["target"])
        assert info["context_length"] == 256
        assert info["speculative_algorithm"] is None
        assert "avg_spec_accept_length" in info["internal_states"][0]
        assert info["version"]


def test_models_and_model_info(plain_server, tiny_models):
    models = plain_server.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == str(tiny_models["target"]) and card["max_model_len"] == 256
    # bench_serving reads the tokenizer location from /model_info
    info = plain_server.get("/model_info").json()
    assert info["tokenizer_path"] == str(tiny_models["target"])
    assert info["architectures"] == ["Qwen3MoeForCausalLM"]


def test_flush_cache(plain_server):
    resp = plain_server.post("/flush_cache?timeout=60", b"")
    assert resp.status_code == 200


def test_generate_non_stream(plain_server):
    out = plain_server.post("/generate", {"text": "def f(x):", "sampling_params": GREEDY}).json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 16
    assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert isinstance(out["text"], str) and out["text"]
    assert "spec_verify_ct" not in meta


def test_generate_stream_is_cumulative_and_matches_non_stream(plain_server):
    body = {"text": "class A:", "sampling_params": GREEDY}
    final = plain_server.post("/generate", body).json()
    payloads = plain_server.stream("/generate", {**body, "stream": True})
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
        assert before["meta_info"]["finish_reason"] is None
    assert chunks[-1]["output_ids"] == final["output_ids"]
    assert chunks[-1]["text"] == final["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 16}


def test_generate_input_ids_and_batch(plain_server):
    single = plain_server.post("/generate", {"input_ids": [5, 6, 7], "sampling_params": GREEDY}).json()
    assert single["meta_info"]["prompt_tokens"] == 3
    batch = plain_server.post("/generate", {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": GREEDY}).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == single["output_ids"]
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [3, 2]


def test_stop_token_ids(plain_server):
    ids = plain_server.post("/generate", {"input_ids": [11, 12], "sampling_params": GREEDY}).json()["output_ids"]
    stop_id = ids[3]
    cut = ids.index(stop_id)
    out = plain_server.post(
        "/generate", {"input_ids": [11, 12], "sampling_params": {**GREEDY, "stop_token_ids": [stop_id]}}
    ).json()
    assert out["output_ids"] == ids[: cut + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


def test_completions_non_stream(plain_server):
    body = {"model": "any", "prompt": "import os", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    out = plain_server.post("/v1/completions", body).json()
    assert out["object"] == "text_completion"
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 8
    native = plain_server.post("/generate", {"text": "import os", "sampling_params": {**GREEDY, "max_new_tokens": 8}})
    assert out["choices"][0]["text"] == native.json()["text"]


def test_completions_stream_deltas_and_usage(plain_server):
    body = {"model": "any", "prompt": "import os", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    full = plain_server.post("/v1/completions", body).json()["choices"][0]["text"]
    payloads = plain_server.stream(
        "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    usage_chunk = chunks.pop()
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_completions_token_prompt(plain_server):
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    out = plain_server.post("/v1/completions", body).json()
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


async def _stream_many(url: str, n: int, max_new_tokens: int) -> list[dict]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int) -> dict:
            body = {
                "input_ids": [3 + i, 4, 5],
                "stream": True,
                "sampling_params": {"temperature": 0.8, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            }
            last = None
            async with session.post(url + "/generate", json=body) as resp:
                assert resp.status == 200
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        last = json.loads(line[6:])
            return last

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_concurrent_streams_all_complete(plain_server):
    finals = asyncio.run(_stream_many(plain_server.url, n=12, max_new_tokens=24))
    assert len(finals) == 12
    assert all(f["meta_info"]["finish_reason"] == {"type": "length", "length": 24} for f in finals)
    assert all(len(f["output_ids"]) == 24 for f in finals)
    assert len({f["meta_info"]["id"] for f in finals}) == 12
    stats = plain_server.get("/server_info").json()["internal_states"][0]
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
