"""Load past capacity: at 4x --max-running-requests the server queues and loses nothing, and a storm of clients
that vanish mid-stream (running and queued alike) frees every slot."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from workflow_scripts.client.cell import CellPlan, run_cell
from workflow_scripts.client.prompts import Prompt

SLOTS = 2
OVERLOAD = 4 * SLOTS


@pytest.fixture(scope="module")
def small_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--max-running-requests", str(SLOTS))


def _stats(server) -> dict:
    return server.get("/server_info").json()["internal_states"][0]


class _StatsWatch:
    """Polls /server_info while a load runs: the most requests seen running and waiting at once."""

    def __init__(self, server):
        self.server = server
        self.max_running = self.max_waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            stats = _stats(self.server)
            self.max_running = max(self.max_running, stats["num_running"])
            self.max_waiting = max(self.max_waiting, stats["num_waiting"])
            time.sleep(0.02)

    def __enter__(self) -> _StatsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _wait_stats(server, done, timeout_s: float = 15.0) -> dict:
    """The engine's stats once `done(stats)` holds (or the last ones seen when the timeout ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = _stats(server)
        if done(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _wait_idle(server) -> dict:
    return _wait_stats(server, lambda st: st["num_running"] == 0 and st["num_waiting"] == 0)


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_four_times_the_slots_queues_and_loses_nothing(small_server, api):
    prompts = [Prompt(prompt_id=i, input_ids=[(7 * i + j) % 200 + 2 for j in range(12)]) for i in range(8)]
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 24, "ignore_eos": True}
    plan = CellPlan(concurrency=OVERLOAD, warmup=0, measured=3 * OVERLOAD, api=api, request_timeout_s=120)
    with _StatsWatch(small_server) as watch:
        result = run_cell(small_server.url, plan, prompts, params, f"overload-{api}")
    errored = [r.error for r in result.records if r.error]
    completed = [r for r in result.records if r.error is None and r.finish_reason == "length"]
    assert len(result.records) == plan.total  # every request sent came back
    assert errored == [] and len(completed) == plan.total
    assert all(r.output_tokens == params["max_new_tokens"] for r in completed)
    # it really was past capacity: the engine never ran more than its slots, and the rest queued
    assert watch.max_running == SLOTS and watch.max_waiting > 0
    assert _wait_idle(small_server)["num_running"] == 0


def _open_stream(url: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    sock.sendall(head.encode() + payload)
    return sock


def _wait_streaming(sock: socket.socket, timeout_s: float) -> None:
    """Returns once the response is a 200 carrying SSE data."""
    sock.settimeout(timeout_s)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(4096)
        assert chunk, f"server closed the stream: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received


def test_storm_of_disconnects_frees_every_slot(small_server):
    long = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}  # the server's context is 2048
    before = _stats(small_server)["total_generated_tokens"]
    socks = [_open_stream(small_server.url, {"input_ids": [i + 2, 5, 9], "stream": True, "sampling_params": long})
             for i in range(OVERLOAD)]
    # the first stream produces tokens; then SLOTS run and the others wait in the queue
    _wait_streaming(socks[0], 30)
    stats = _wait_stats(small_server, lambda st: st["num_running"] == SLOTS and st["num_waiting"] == OVERLOAD - SLOTS)
    assert stats["num_running"] == SLOTS and stats["num_waiting"] == OVERLOAD - SLOTS, stats
    for i, sock in enumerate(socks):
        if i % 2:  # half vanish abruptly (RST, as a killed client), half close politely (FIN)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    stats = _wait_idle(small_server)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0, stats
    # none of the abandoned requests ran to its end: fewer tokens than one of them asked for were generated
    assert _stats(small_server)["total_generated_tokens"] - before < long["max_new_tokens"]
    # and the freed slots serve new work at once
    body = {"input_ids": [3, 4, 5], "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}
    assert small_server.post("/generate", body).json()["meta_info"]["completion_tokens"] == 4
