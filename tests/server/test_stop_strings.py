"""Stop strings: the text is cut before the stop string (SGLang's trim), ids end at the token completing it."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

PROMPT = "def main():"
FREE = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module")
def greedy_and_stop(plain_server) -> tuple[str, str]:
    """The unconstrained greedy text and a stop string taken from its middle."""
    full = plain_server.post("/generate", {"text": PROMPT, "sampling_params": FREE}).json()["text"]
    candidates = [full[i : i + 3] for i in range(4, len(full) - 3) if "\ufffd" not in full[i : i + 3]]
    assert candidates, f"no usable stop string in {full!r}"
    return full, candidates[0]


def test_stop_string_trims_text_and_stops(plain_server, tiny_models, greedy_and_stop):
    full, stop = greedy_and_stop
    out = plain_server.post("/generate", {"text": PROMPT, "sampling_params": {**FREE, "stop": [stop]}}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == full[: full.find(stop)]
    tok = Tokenizer.from_file(str(tiny_models["target"] / "tokenizer.json"))
    ids = out["output_ids"]
    assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1])
    assert out["meta_info"]["completion_tokens"] == len(ids)


def test_no_stop_trim_keeps_the_stop_string(plain_server, greedy_and_stop):
    full, stop = greedy_and_stop
    params = {**FREE, "stop": stop, "no_stop_trim": True}
    out = plain_server.post("/generate", {"text": PROMPT, "sampling_params": params}).json()
    assert out["text"] == full[: full.find(stop) + len(stop)]


def test_stop_string_in_stream(plain_server, greedy_and_stop):
    full, stop = greedy_and_stop
    body = {"text": PROMPT, "stream": True, "sampling_params": {**FREE, "stop": stop}}
    chunks = [json.loads(p) for p in plain_server.stream("/generate", body)[:-1]]
    assert all(stop not in c["text"] for c in chunks)
    assert chunks[-1]["text"] == full[: full.find(stop)]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_string_in_completions(plain_server, greedy_and_stop):
    full, stop = greedy_and_stop
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": stop}
    choice = plain_server.post("/v1/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert choice["text"] == full[: full.find(stop)]
