"""The API describes itself: /openapi.json declares every route's body and responses, and schemathesis, driven by
that document alone, finds no failure and no server error, and leaves the server healthy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import REPO_ROOT

CONTEXT_LENGTH = 64  # small, so that every generated request is quick; the document states it
BODY_ROUTES = {("/generate", "post"), ("/generate", "put"), ("/v1/completions", "post"),
               ("/v1/chat/completions", "post")}


@pytest.fixture(scope="module")
def fuzz_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--context-length", str(CONTEXT_LENGTH),
                        "--max-running-requests", "4")


def test_document_declares_bodies_responses_and_streams(fuzz_server):
    doc = fuzz_server.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert "200" in op["responses"] and "500" in op["responses"], (path, method)
            if (path, method) in BODY_ROUTES:
                assert op["requestBody"]["required"] is True
                assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
                assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert BODY_ROUTES <= {(p, m) for p, item in doc["paths"].items() for m in item}
    # the served model's limits are in the document
    sampling = schemas["SamplingParamsIn"]["properties"]
    assert sampling["max_new_tokens"]["anyOf"][0]["maximum"] == CONTEXT_LENGTH - 1
    models = fuzz_server.get("/v1/models").json()
    assert models["data"][0]["max_model_len"] == CONTEXT_LENGTH
    ids = schemas["GenerateIds"]["properties"]["input_ids"]["anyOf"][0]
    assert ids["maxItems"] == CONTEXT_LENGTH - 1 and ids["items"]["maximum"] > 255
    assert not re.search(r'"x-(ref|token-id|max-tokens|prompt-ids)"', fuzz_server.get("/openapi.json").text)


def test_schemathesis_finds_nothing_and_the_server_stays_healthy(fuzz_server, tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), SCHEMATHESIS_HOOKS="tests.server.schemathesis_hooks",
               SPECSTUDY_FUZZ_CONTEXT_LENGTH=str(CONTEXT_LENGTH))
    cli = Path(sys.executable).parent / "schemathesis"
    proc = subprocess.run(
        [str(cli), "run", f"{fuzz_server.url}/openapi.json", "--checks", "all", "--seed", "0", "--max-examples", "5",
         "--workers", "1", "--generation-database", "none", "--no-color",
         "--report", "junit", "--report-junit-path", str(tmp_path / "junit.xml")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,  # no cache left in the checkout
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", out)
    assert generated and generated.group(1) == generated.group(2) and int(generated.group(1)) > 500, out[-3000:]
    assert "No issues found" in out
    junit = (tmp_path / "junit.xml").read_text()
    assert 'failures="0"' in junit and 'errors="0"' in junit
    # healthy afterwards: a real generation works, and no request is left running or queued
    assert fuzz_server.get("/health_generate").status_code == 200
    stats = fuzz_server.get("/server_info").json()["internal_states"][0]
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert "Traceback" not in fuzz_server.log_path.read_text()
