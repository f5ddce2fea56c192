"""--incremental-streaming-output and --stream-interval: the study client's records are the same either way."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from workflow_scripts.client.prompts import Prompt
from workflow_scripts.client.streaming import send

PROMPTS = [Prompt(0, text="def f(x):"), Prompt(1, text="import sys\n"), Prompt(2, input_ids=[5, 9, 17, 33, 2])]
PARAMS = [
    {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 40, "ignore_eos": True},
    {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 40, "ignore_eos": False, "stop": ["\n", "in"]},
]
INTERVAL = 4
# Timestamps and chunk boundaries depend on timing (the front merges events that arrive together); the rest must match.
TIMING_FIELDS = {"send_ts", "first_token_ts", "chunk_ts", "chunk_tokens", "end_ts", "ttft_s", "e2e_s"}


@pytest.fixture(scope="module")
def incremental_server(start_server, tiny_models):
    return start_server(
        tiny_models["target"], "--context-length", "256", "--max-running-requests", "8",
        "--incremental-streaming-output", "--stream-interval", str(INTERVAL),
    )  # fmt: skip


async def _records(url: str, incremental: bool) -> list:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        return await asyncio.gather(*(
            send(session, url, "generate", prompt, params, f"r{i}-{j}", "default", incremental=incremental)
            for i, prompt in enumerate(PROMPTS) for j, params in enumerate(PARAMS)
        ))  # fmt: skip


def test_incremental_and_cumulative_give_identical_records(plain_server, incremental_server):
    cumulative = asyncio.run(_records(plain_server.url, incremental=False))
    incremental = asyncio.run(_records(incremental_server.url, incremental=True))
    for cum, inc in zip(cumulative, incremental, strict=True):
        assert cum.error is None and inc.error is None, (cum.error, inc.error)
        assert cum.output_tokens == len(cum.output_ids) > 0
        a = {k: v for k, v in cum.as_row().items() if k not in TIMING_FIELDS}
        b = {k: v for k, v in inc.as_row().items() if k not in TIMING_FIELDS}
        assert a == b
        assert cum.text == inc.text
        assert sum(inc.chunk_tokens) == inc.output_tokens
    assert any(r.finish_reason == "stop" for r in cumulative), "no request exercised a stop string"


def test_incremental_chunks_carry_only_what_is_new(incremental_server):
    body = {"text": "def f(x):", "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 30,
                                                                      "ignore_eos": True}}
    chunks = [json.loads(c) for c in incremental_server.stream("/generate", body)[:-1]]
    whole = incremental_server.post("/generate", dict(body, stream=False)).json()
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [i for c in chunks for i in c["output_ids"]] == whole["output_ids"]
    # --stream-interval: every chunk but the last brings at least INTERVAL new tokens
    assert all(len(c["output_ids"]) >= INTERVAL for c in chunks[:-1]) and len(chunks) <= 30 // INTERVAL + 1
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"

