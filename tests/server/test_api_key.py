"""--api-key, SGLang's rule: 401 without the key or with a wrong one, 200 with it; /health* and /metrics stay open."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import requests

from workflow_scripts.client.prompts import Prompt
from workflow_scripts.client.streaming import send

KEY = "test-key-0123"
BODY = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}}


@pytest.fixture(scope="module")
def keyed_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--api-key", KEY, "--enable-metrics")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}],
                         ids=["no key", "wrong key", "no Bearer"])  # fmt: skip
def test_without_the_right_key_is_401(keyed_server, headers):
    for path in ("/generate", "/v1/completions"):
        resp = requests.post(keyed_server.url + path, json=BODY, headers=headers, timeout=30)
        assert resp.status_code == 401
        assert resp.json()["error"]["param"] == "Authorization"
    assert requests.get(keyed_server.url + "/server_info", headers=headers, timeout=30).status_code == 401


def test_with_the_key_is_200_and_health_stays_open(keyed_server):
    resp = requests.post(keyed_server.url + "/generate", json=BODY, headers={"Authorization": f"Bearer {KEY}"},
                         timeout=30)  # fmt: skip
    assert resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] == 3
    for path in ("/health", "/health_generate", "/metrics"):
        assert requests.get(keyed_server.url + path, timeout=30).status_code == 200
    info = requests.get(keyed_server.url + "/server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert KEY not in info.text  # the key is never reported back


def test_study_client_sends_the_key(keyed_server):
    async def one(api_key: str | None):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4, "ignore_eos": True}
            return await send(session, keyed_server.url, "generate", Prompt(0, input_ids=[4, 5]), params, "k", "default",
                              api_key=api_key)  # fmt: skip

    assert asyncio.run(one(KEY)).error is None
    assert asyncio.run(one(None)).error.startswith("HTTP 401")


def test_openapi_document_declares_the_bearer_scheme(keyed_server):
    doc = requests.get(keyed_server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    doc = doc.json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in doc["paths"].items():
        for op in item.values():
            keyed = not path.startswith(("/health", "/metrics"))
            assert ("security" in op and "401" in op["responses"]) == keyed, path
