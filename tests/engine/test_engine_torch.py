"""The engine process behind the HTTP server sets up torch as the in-process engine does (engine/torch_setup.py).

A served engine left on torch's default pool of every core ran at 0.6 of the in-process engine on a 2-core host
(docs/embedded_engine_served.md); comparing the setups catches that without timing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from workflow_scripts.engine.torch_setup import DEFAULT_THREADS, THREADS_ENV
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120

# a fresh process, as benchmarks/engine_bench.py drives the engine: nothing else in it has touched torch's pools
IN_PROCESS = """
import json, sys
from pathlib import Path
from workflow_scripts.engine.scheduler import Scheduler
engine = Scheduler(Path(sys.argv[1]), None, 4, 0)
engine.start()
print(json.dumps(engine.torch_config))
engine.stop()
"""


def clean_env() -> dict[str, str | None]:
    """No thread settings inherited from the test's environment: both sides resolve the engine's default."""
    return {"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", THREADS_ENV: None, "OMP_NUM_THREADS": None,
            "MKL_NUM_THREADS": None}


def in_process_config(model: Path) -> dict:
    env = {k: v for k, v in (os.environ | clean_env()).items() if v is not None}
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(model)], env=env, capture_output=True, text=True,
                         timeout=STARTUP_TIMEOUT_S, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_served_engine_torch_setup_equals_the_in_process_engine(smoke_pair, tmp_path):
    target, _ = smoke_pair
    port = free_port()
    # as the study launches a server, with no --num-threads: the default is where the two paths once parted
    spec = ServerSpec("embedded", str(target), None, "127.0.0.1", 4, 0, num_threads=None)
    with ServerProcess(build_command(spec, {}, port), tmp_path / "server.log", f"http://127.0.0.1:{port}",
                       STARTUP_TIMEOUT_S, env=clean_env()) as server:
        info = requests.get(server.base_url + "/get_server_info", timeout=30).json()
    served = info["engine_torch"]
    expected = in_process_config(target)

    assert served == expected
    assert served["num_threads"] == DEFAULT_THREADS
    assert served["inference_mode"] and not served["grad_enabled"]


def test_bad_thread_variable_is_refused_naming_it(smoke_pair, monkeypatch):
    """With no --num-threads the variable decides; a bad value stops the server before any process starts."""
    from workflow_scripts.server.server_args import ServerArgsError, parse_server_args

    monkeypatch.setenv(THREADS_ENV, "0")
    with pytest.raises(ServerArgsError, match=f"{THREADS_ENV}='0': must be >= 1"):
        parse_server_args(["--model-path", str(smoke_pair[0])])
