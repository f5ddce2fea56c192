"""With one slot: a client that goes away frees it (the next request runs at once, not after 2000 tokens),
and a health check still answers while the slot is busy."""

from __future__ import annotations

import json
import socket
import time

import pytest

LONG = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def one_slot_server(start_server, tiny_models):
    return start_server(tiny_models["target"], "--max-running-requests", "1")


def _open_request(url: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    sock.sendall(head.encode() + payload)
    return sock


def _generated(server) -> int:
    return server.get("/server_info").json()["internal_states"][0]["total_generated_tokens"]


def _short_request_completes(server) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}
    assert server.post("/generate", body).json()["meta_info"]["completion_tokens"] == 4


def test_stream_disconnect_frees_the_slot(one_slot_server):
    before = _generated(one_slot_server)
    sock = _open_request(one_slot_server.url, {"input_ids": [1, 2, 3], "stream": True, "sampling_params": LONG})
    received = b""
    deadline = time.monotonic() + 30
    while b"data: " not in received and time.monotonic() < deadline:
        received += sock.recv(4096)
    assert b"data: " in received, received
    sock.close()
    _short_request_completes(one_slot_server)
    assert _generated(one_slot_server) - before < 2000 + 4
    assert "client disconnected" in one_slot_server.log_path.read_text()


def test_non_stream_disconnect_frees_the_slot(one_slot_server):
    before = _generated(one_slot_server)
    sock = _open_request(one_slot_server.url, {"input_ids": [4, 5, 6], "sampling_params": LONG})
    time.sleep(0.05)
    sock.close()
    _short_request_completes(one_slot_server)
    assert _generated(one_slot_server) - before < 2000 + 4
    stats = one_slot_server.get("/server_info").json()["internal_states"][0]
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0


def test_health_generate_answers_while_the_only_slot_is_busy(one_slot_server):
    sock = _open_request(one_slot_server.url, {"input_ids": [7, 8, 9], "sampling_params": LONG})
    try:
        time.sleep(0.2)
        started = time.monotonic()
        assert one_slot_server.get("/health_generate").status_code == 200
        health_s = time.monotonic() - started
        busy = one_slot_server.get("/server_info").json()["internal_states"][0]
    finally:
        sock.close()
    assert busy["num_running"] == 1, busy  # the long request was still running: health did not wait for it
    assert health_s < 5
