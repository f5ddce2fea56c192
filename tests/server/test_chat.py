"""/v1/chat/completions: the conversation goes through the model's own chat template (the same prompt that
transformers' apply_chat_template builds), plain and streamed, in OpenAI's shapes."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

MESSAGES = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "def parse(value):"}]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def chat_prompt_ids(tiny_models) -> list[int]:
    tok = AutoTokenizer.from_pretrained(tiny_models["target"])
    return tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def _native(server, input_ids: list[int], max_new: int) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {**GREEDY, "max_new_tokens": max_new}}
    return server.post("/generate", body).json()


def test_chat_uses_the_template_and_answers_like_openai(plain_server, chat_prompt_ids):
    out = plain_server.post("/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 6, **GREEDY})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["object"] == "chat.completion" and body["model"] == "m"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(chat_prompt_ids), "completion_tokens": 6,
                             "total_tokens": len(chat_prompt_ids) + 6}
    # the same prompt ids through /generate give the same text: the template is the model's
    assert choice["message"]["content"] == _native(plain_server, chat_prompt_ids, 6)["text"]


def test_chat_stream_deltas_usage_and_done(plain_server):
    body = {"messages": MESSAGES, "max_completion_tokens": 6, **GREEDY}
    full = plain_server.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    payloads = plain_server.stream(
        "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == full
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}


def test_chat_stream_without_include_usage_sends_no_usage_chunk(plain_server):
    payloads = plain_server.stream("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, "stream": True})
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["choices"] and c.get("usage") is None for c in chunks)


def test_chat_stop_string_finishes_with_stop(plain_server, chat_prompt_ids):
    text = _native(plain_server, chat_prompt_ids, 12)["text"]
    stop = text[4:6]
    assert stop.strip(), f"greedy text too uniform to pick a stop string: {text!r}"
    out = plain_server.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "stop": stop, **GREEDY})
    choice = out.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert choice["message"]["content"] == text[: text.find(stop)]


def test_content_parts_are_joined_text(plain_server):
    parts = [{"role": "user", "content": [{"type": "text", "text": "def "}, {"type": "text", "text": "parse(value):"}]}]
    whole = [{"role": "user", "content": "def parse(value):"}]
    answers = [plain_server.post("/v1/chat/completions", {"messages": m, "max_tokens": 4, **GREEDY}).json()
               for m in (parts, whole)]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
    assert answers[0]["usage"] == answers[1]["usage"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
    ({"messages": MESSAGES, "max_completion_tokens": 10**6}, "max_completion_tokens"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": MESSAGES, "logprobs": True}, "logprobs"),
    ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_chat_refuses_naming_the_field(plain_server, body, field):
    resp = plain_server.post("/v1/chat/completions", body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field, resp.json()


def test_model_without_chat_template_refuses_chat_naming_messages(start_server, tiny_models, tmp_path_factory):
    """A checkpoint whose tokenizer_config.json has no chat_template still serves /generate; chat says why not."""
    import shutil

    bare = tmp_path_factory.mktemp("no_template") / "target"
    shutil.copytree(tiny_models["target"], bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    server = start_server(bare)
    resp = server.post("/v1/chat/completions", {"messages": MESSAGES})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    assert "chat_template" in resp.json()["error"]["message"]
    assert server.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
