"""--enable-metrics: /metrics in Prometheus' format with SGLang's names, and counters that match what was sent,
read through the study client's scrape/cell_deltas."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import server_process, standalone_args
from workflow_scripts.client.prompts import Prompt
from workflow_scripts.client.server_metrics import MetricsUnavailable, cell_deltas, scrape
from workflow_scripts.client.slicing import Conductor
from workflow_scripts.client.streaming import send
from workflow_scripts.engine.types import FORWARD_MODES
from workflow_scripts.launcher.process import free_port

STEPS = 2
PARAMS = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 20, "ignore_eos": True}
SGLANG_NAMES = {
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:spec_accept_length",
    "sglang:spec_accept_rate", "sglang:spec_verify_calls", "sglang:generation_tokens", "sglang:prompt_tokens",
    "sglang:num_requests", "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
}  # fmt: skip


@pytest.fixture(scope="module")
def metrics_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--enable-metrics", "--max-running-requests", "4",
                        *standalone_args(tiny_models["draft"], STEPS))


async def _cell(url: str, n: int) -> tuple[dict, list, dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        before = await scrape(session, url)
        prompts = [Prompt(i, input_ids=[3 + i, 7, 11 + i, 19]) for i in range(n)]
        records = await asyncio.gather(*(send(session, url, "generate", p, PARAMS, f"m{p.prompt_id}", "default")
                                         for p in prompts))  # fmt: skip
        after = await scrape(session, url)
    return before, records, after


def test_metrics_parse_and_carry_sglang_names(metrics_server):
    resp = requests.get(metrics_server.url + "/metrics", timeout=30)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert SGLANG_NAMES <= set(families), SGLANG_NAMES - set(families)
    assert families["sglang:spec_verify_calls"].type == "counter"
    assert families["sglang:time_to_first_token_seconds"].type == "histogram"
    assert families["sglang:num_running_reqs"].type == "gauge"
    assert all(s.labels.get("model_name") for f in families.values() for s in f.samples)


def test_cell_deltas_match_the_requests_sent(metrics_server):
    n = 6
    before, records, after = asyncio.run(_cell(metrics_server.url, n))
    assert all(r.error is None for r in records), [r.error for r in records]
    d = cell_deltas(before, after)
    assert d["sglang:num_requests_total"] == n
    assert d["sglang:num_aborted_requests_total"] == 0
    assert d["sglang:generation_tokens_total"] == sum(r.output_tokens for r in records)
    assert d["sglang:prompt_tokens_total"] == sum(r.prompt_tokens for r in records)
    assert d["sglang:time_to_first_token_seconds_count"] == n
    assert d["sglang:e2e_request_latency_seconds_count"] == n
    assert 0 < d["sglang:e2e_request_latency_seconds_sum"] <= sum(r.end_ts - r.send_ts for r in records)
    verify = sum(r.spec_verify_ct for r in records)
    assert d["sglang:spec_verify_calls_total"] == verify
    # gauges: the value after the cell, over the interval since the scrape before it (verify steps only: the
    # first token of each request comes from its prefill)
    committed_by_verify = sum(r.output_tokens for r in records) - n  # a verify may commit past max_new_tokens' cut
    assert committed_by_verify / verify <= d["sglang:spec_accept_length"] <= STEPS + 1
    assert 0.0 <= d["sglang:spec_accept_rate"] <= 1.0
    assert d["sglang:gen_throughput"] > 0
    assert d["sglang:num_running_reqs"] == 0 and d["sglang:num_queue_reqs"] == 0
    # the engine's own forward time by mode: one thread runs them one after another inside the cell, decode steps
    # (verifies here) and the prompts' prefills both ran, and nothing mixed them (--enable-mixed-chunk is off)
    seconds = {mode: d[f"specstudy:{mode}_forward_seconds_total"] for mode in FORWARD_MODES}
    assert seconds["decode"] > 0 and seconds["extend"] > 0 and seconds["mixed"] == 0
    assert sum(seconds.values()) <= max(r.end_ts for r in records) - min(r.send_ts for r in records)
    # the engine thread's CPU time in them (the server runs one torch thread): never more than their wall time, and
    # most of it on an idle core
    cpu = {mode: d[f"specstudy:{mode}_forward_cpu_seconds_total"] for mode in FORWARD_MODES}
    assert cpu["mixed"] == 0 and all(0 < cpu[mode] <= seconds[mode] * 1.01 for mode in ("decode", "extend"))
    # and their count: with 4 slots for 6 requests, at least 2 prefill-only forwards, and a decode forward for every
    # verify step of the longest request
    forwards = {mode: d[f"specstudy:{mode}_forwards_total"] for mode in FORWARD_MODES}
    assert forwards["extend"] >= 2 and forwards["mixed"] == 0
    assert forwards["decode"] >= max(r.spec_verify_ct for r in records)


def test_scraping_a_server_without_metrics_names_the_url(plain_server):
    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            await scrape(session, plain_server.url)

    with pytest.raises(MetricsUnavailable, match="/metrics answered HTTP 404"):
        asyncio.run(go())


def test_a_time_sliced_servers_cpu_clock_counts_only_its_turns(tiny_models, tmp_path):
    """A sliced cell (client/slicing.py) freezes the server between its turns, often in the middle of a forward:
    the forwards' wall time counts those freezes, the engine thread's CPU time does not (analysis/forward_time.py
    reads a sliced cell with it)."""
    server = server_process(tiny_models["target"], tmp_path / "server.log", free_port(), "--enable-metrics",
                            "--max-running-requests", "4")
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        server.start()
        with Conductor({"server": server.proc.pid, "other": other.pid}, 0.03, ["server", "other"]) as conductor:
            # A freeze swells a forward's wall time by the other member's whole turn only where it lands in the
            # middle of one, which is chance: the forwards fill part of the server's turns, less on a fast host
            # (one cell of ~10 freezes once had none land in a forward). So cells are sent until a freeze was
            # counted, five at most, and the CPU bound holds over all of them.
            first = None
            for _ in range(5):
                before, records, after = asyncio.run(_cell(server.base_url, 16))
                assert all(r.error is None for r in records), [r.error for r in records]
                d = cell_deltas(first := first or before, after)
                wall = sum(d[f"specstudy:{mode}_forward_seconds_total"] for mode in FORWARD_MODES)
                cpu = sum(d[f"specstudy:{mode}_forward_cpu_seconds_total"] for mode in FORWARD_MODES)
                if wall - cpu >= conductor.slice_s:
                    break
        ran = sum(end - start for start, end in conductor.intervals["server"])
        assert 0 < cpu <= ran * 1.05, (cpu, ran)  # the turns' length bounds the forwards' CPU time
        # no count of freezes (how many land in a forward depends on the host's load), only that one was counted
        assert wall - cpu >= conductor.slice_s, (wall, cpu)
    finally:
        server.stop()
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
