"""--enable-in-engine-bench: POST /in_engine_bench runs a closed-loop cell on the server's own engine (the
reference side of benchmarks/client_overhead.py), with the tokens /generate gives, and refuses bad input."""

from __future__ import annotations

import pytest

from tests.server.conftest import standalone_args

STEPS = 2
PARAMS = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
PROMPTS = [[3 + i, 7, 11 + i, 19] for i in range(5)]


@pytest.fixture(scope="module")
def bench_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--enable-in-engine-bench", "--max-running-requests", "4",
                        *standalone_args(tiny_models["draft"], STEPS))


def test_cell_runs_on_the_server_engine_with_generate_s_tokens(bench_server):
    resp = bench_server.post("/in_engine_bench", {"input_ids": PROMPTS, "sampling_params": PARAMS, "concurrency": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    reqs = body["requests"]
    assert len(reqs) == len(PROMPTS)
    assert min(r["submit"] for r in reqs) == 0.0
    for r in reqs:
        assert len(r["times"]) == len(r["output_ids"]) == PARAMS["max_new_tokens"]
        assert r["submit"] <= r["times"][0] and r["times"] == sorted(r["times"])
    # closed loop at C=2: the third request is sent only when one of the first two has finished
    first_end = min(r["times"][-1] for r in reqs[:2])
    assert reqs[2]["submit"] >= first_end
    before, after = body["engine_before"], body["engine_after"]
    assert after["total_generated_tokens"] - before["total_generated_tokens"] == len(PROMPTS) * PARAMS["max_new_tokens"]
    assert after["total_verify_ct"] > before["total_verify_ct"]  # the server's speculative engine ran it
    for prompt, r in zip(PROMPTS, reqs):
        generated = bench_server.post("/generate", {"input_ids": prompt, "sampling_params": PARAMS})
        assert generated.status_code == 200, generated.text
        assert generated.json()["output_ids"] == r["output_ids"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_ids": PROMPTS, "concurrency": 0}, "concurrency"),
        ({"input_ids": [], "concurrency": 1}, "input_ids"),
        ({"input_ids": [[3, 10**9]], "concurrency": 1}, "input_ids.0"),
        ({"input_ids": PROMPTS, "concurrency": 1, "sampling_params": {"temperature": -1.0}}, "sampling_params.temperature"),
        ({"input_ids": PROMPTS, "concurrency": 1, "sampling_params": {"stop": "x"}}, "sampling_params.stop"),
        ({"input_ids": PROMPTS, "concurrency": 1, "warmup": 2}, "warmup"),
    ],
)
def test_bad_cells_are_refused_naming_the_field(bench_server, body, field):
    resp = bench_server.post("/in_engine_bench", body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field
    assert bench_server.get("/health").status_code == 200


def test_a_cell_past_its_timeout_is_aborted_and_the_server_serves_on(bench_server):
    body = {"input_ids": PROMPTS * 4, "sampling_params": {**PARAMS, "max_new_tokens": 200}, "concurrency": 1,
            "timeout_s": 0.05}
    resp = bench_server.post("/in_engine_bench", body)
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["param"] == "timeout_s"
    generated = bench_server.post("/generate", {"input_ids": PROMPTS[0], "sampling_params": PARAMS})
    assert generated.status_code == 200 and len(generated.json()["output_ids"]) == PARAMS["max_new_tokens"]
    assert bench_server.get("/server_info").json()["internal_states"][0]["num_running"] == 0


def test_without_the_flag_there_is_no_route(start_server, tiny_models):
    server = start_server(tiny_models["target"])
    assert server.post("/in_engine_bench", {"input_ids": PROMPTS, "concurrency": 1}).status_code == 404
