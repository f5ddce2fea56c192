"""Server lifecycle: bounded start-up, the log tail in every failure, and the whole process group stopped."""

from __future__ import annotations

import os
import sys
import time

import pytest

from workflow_scripts.launcher.process import ServerError, ServerProcess, free_port

# A "server" that forks a grandchild (as SGLang's scheduler processes are) and never becomes ready.
HANGS = """
import os, sys, time
print("loading weights", flush=True)
if os.fork() == 0:
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(120)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purpose
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_hung_start_fails_in_bounded_time_with_log_tail_and_kills_the_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    argv = [sys.executable, "-c", HANGS, str(pidfile)]
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ServerError) as err:
        ServerProcess(argv, tmp_path / "server.log", url, startup_timeout_s=3).start()
    assert time.monotonic() - t0 < 30
    assert "server.startup_timeout_s" in str(err.value) and "loading weights" in str(err.value)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the server's grandchild outlived stop()"


def test_server_that_exits_at_start_reports_exit_code_and_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('error: unrecognized arguments: --bogus'); sys.exit(2)"]
    with pytest.raises(ServerError, match="exited during start-up with exit code 2") as err:
        ServerProcess(argv, tmp_path / "server.log", f"http://127.0.0.1:{free_port()}", startup_timeout_s=30).start()
    assert "--bogus" in str(err.value)


def test_log_is_appended_across_launches_and_each_launch_reads_its_own_part(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("previous launch\n")
    argv = [sys.executable, "-c", "print('this launch', flush=True); import time; time.sleep(30)"]
    srv = ServerProcess(argv, log, f"http://127.0.0.1:{free_port()}", startup_timeout_s=1)
    with pytest.raises(ServerError):
        srv.start()
    assert "previous launch" in log.read_text()
    assert "previous launch" not in srv.log_since_start() and "this launch" in srv.log_since_start()
