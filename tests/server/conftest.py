"""Real servers on 127.0.0.1 over tiny random models, each started once per session and always stopped."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.server.tiny_models import build_tiny_models
from workflow_scripts.launcher.process import ServerProcess, free_port

STARTUP_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 60
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny_models"))


def standalone_args(draft: Path, steps: int) -> tuple[str, ...]:
    """The flags of a STANDALONE setting with `steps` drafts (SGLang's names, topk 1)."""
    return ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1))


def server_argv(model: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "workflow_scripts.engine.launch_server", "--model-path", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--random-seed", "0", "--num-threads", "1", *extra,
    ]  # fmt: skip


def server_process(model: Path, log_path: Path, port: int, *extra: str) -> ServerProcess:
    """A server on 127.0.0.1:`port`, not yet started: for a test that needs its process (signals, process group)."""
    return ServerProcess(server_argv(model, port, *extra), log_path, f"http://127.0.0.1:{port}", STARTUP_TIMEOUT_S,
                         env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})


class Server:
    """A running server: its base URL and log, plus JSON helpers bounded in time."""

    def __init__(self, base_url: str, log_path: Path):
        self.url = base_url
        self.log_path = log_path

    def post(self, path: str, body: dict | bytes, **kw) -> requests.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return requests.post(self.url + path, data=data, timeout=REQUEST_TIMEOUT_S, **kw)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=REQUEST_TIMEOUT_S)

    def stream(self, path: str, body: dict) -> list[str]:
        """The `data:` payloads of an SSE response, in order."""
        with self.post(path, body, stream=True) as resp:
            assert resp.status_code == 200, resp.text
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
        assert all(line.startswith("data: ") for line in lines), lines
        return [line[len("data: ") :] for line in lines]


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Factory: start_server(model_path, *flags) -> Server; every server started is stopped at session end."""
    started: list[ServerProcess] = []
    log_dir = tmp_path_factory.mktemp("server_logs")

    def start(model: Path, *extra: str) -> Server:
        port = free_port()
        log_path = log_dir / f"server_{port}.log"
        proc = server_process(model, log_path, port, *extra)
        proc.start()
        started.append(proc)
        return Server(proc.base_url, log_path)

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def plain_server(start_server, tiny_models) -> Server:
    """No speculation, a short context so that over-long prompts are cheap to send."""
    return start_server(tiny_models["target"], "--context-length", "256", "--max-running-requests", "8")
