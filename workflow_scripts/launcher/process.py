"""Start one server process, wait until it really generates, and always stop its whole process group.

The server runs in its own session so that SIGTERM/SIGKILL reach every child (SGLang spawns scheduler and
detokenizer processes; a stray one would hold the GPU or the port for the next setting).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# between polls of a starting server: each one is a cheap refused connect or 503 until it is up, and every study
# (and the test suite) waits on hundreds of starts
READY_POLL_S = 0.1


class ServerError(RuntimeError):
    """The server did not start, died or hung; the message carries the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no server log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def shown_command(argv: Sequence[str]) -> str:
    """The command line for logs, with the value of --api-key hidden."""
    return " ".join("<redacted>" if prev == "--api-key" else arg for prev, arg in zip(["", *argv], argv))


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    """Context manager around one server: `with ServerProcess(argv, log_path, url) as srv: ...`."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        base_url: str,
        startup_timeout_s: float,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.base_url = base_url.rstrip("/")
        self.startup_timeout_s = startup_timeout_s
        # a None value removes the variable, so a server never inherits e.g. a stale SGLANG_MOE_CONFIG_DIR
        self.env = {k: v for k, v in (dict(os.environ) | dict(env or {})).items() if v is not None}
        self.cwd = cwd  # where `python -m` finds the package: benchmarks.server_startup runs two source trees
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as out:
            self.log_offset = out.tell()
            out.write(f"$ {shown_command(self.argv)}\n")
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True,
                # the server answers Ctrl-C even when its launcher runs with SIGINT ignored (a background job of a
                # non-interactive shell does, and a child would inherit that)
                preexec_fn=_default_sigint,
            )
        log.info("started server pid %d: %s", self.proc.pid, shown_command(self.argv))
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        """Poll /health_generate (a real one-token generation) until it answers 200, the process dies or time runs out."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self.raise_if_dead("exited during start-up")
            if _get(self.base_url + "/health_generate", timeout=10) == 200:
                log.info("server ready at %s", self.base_url)
                return
            time.sleep(READY_POLL_S)
        raise ServerError(
            f"server not ready on {self.base_url}/health_generate after {self.startup_timeout_s:.0f} s "
            f"(server.startup_timeout_s); log {self.log_path} ends with:\n{log_tail(self.log_path)}"
        )

    def log_since_start(self) -> str:
        """This launch's part of the server log (the file is appended to across relaunches)."""
        with open(self.log_path, errors="replace") as fh:
            fh.seek(self.log_offset)
            return fh.read()

    def raise_if_dead(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(
                f"server {what} with exit code {self.proc.returncode}; log {self.log_path} ends with:\n"
                f"{log_tail(self.log_path)}"
            )

    def check_alive(self, timeout_s: float = 30) -> None:
        """Between cells: a crashed or hung server fails the job now, not after every later request timed out.

        /health_generate runs a real generation, so a server whose HTTP front still answers while its engine is
        stuck fails here too."""
        self.raise_if_dead("died")
        if _get(self.base_url + "/health_generate", timeout=timeout_s) != 200:
            raise ServerError(
                f"server at {self.base_url} stopped answering /health_generate within {timeout_s:.0f} s; "
                f"log {self.log_path} ends with:\n{log_tail(self.log_path)}"
            )

    def stop(self, grace_s: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session made it the group leader
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
            try:
                os.killpg(pgid, sig)
                if sig == signal.SIGTERM:  # a stopped (SIGSTOP) server acts on it only once continued, as systemd
                    os.killpg(pgid, signal.SIGCONT)  # does: no grace period spent waiting on a frozen process
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children that outlived the leader (SGLang's scheduler, detokenizer)
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
