"""The servers of a cohort: one per member, started from the cohort plan through the launcher.

Only the launcher knows the engine; this module turns a member's setting into a `ServerSpec`, the environment
(`moe_config: tuned` points the server at the installed configs, `default` makes sure it sees none), and, when
SGLang servers share a node at once, the GPUs each one may use.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from workflow_scripts.launcher.command import ServerSpec, build_command, server_api_key, setting_env
from workflow_scripts.launcher.process import ServerError, ServerProcess, free_port
from workflow_scripts.scaleout.checks import setting_gpus

log = logging.getLogger(__name__)
# uvicorn's (and so SGLang's) message when the port is in use; a server that says it is started again elsewhere
PORT_TAKEN = "address already in use"
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class Models:
    target: Path
    draft: Path | None
    moe_installed: dict | None  # installed.json of the MoE install rule, when a member runs the tuned configs


class Live(NamedTuple):
    """A started member server: its process, URL and spec (the client needs its streaming mode and API key)."""

    process: ServerProcess
    url: str
    spec: ServerSpec


def server_spec(plan: dict, models: Models, threads: int) -> ServerSpec:
    server = plan["server"]
    common = dict(
        engine=plan["engine"],
        model_path=str(models.target),
        draft_path=str(models.draft) if models.draft else None,
        host=server["host"],
        max_running_requests=server["max_running_requests"],
        random_seed=server["random_seed"],
        incremental_streaming=server["incremental_streaming"],
        api_key=server_api_key(server["host"]),
    )
    if plan["engine"] == "embedded":
        return ServerSpec(num_threads=server["num_threads"] or threads, **common)
    sg = plan["sglang"]
    return ServerSpec(sglang_python=sg["python"], tp_size=sg["tp_size"], mem_fraction_static=sg["mem_fraction_static"],
                      **common)


def member_gpus(plan: dict, name: str) -> int:
    return setting_gpus(name, plan["members"][name]["args"], plan["engine"], (plan["sglang"] or {}).get("tp_size", 1))


def gpu_slices(plan: dict, names: list[str]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES per member when several SGLang servers run at once (disjoint GPUs, in order)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(plan["node_gpus"] or 0)]
    out, at = {}, 0
    for name in names:
        n = member_gpus(plan, name)
        if at + n > len(devices):
            raise RuntimeError(f"benchmark.schedule: interleaved needs {at + n} GPUs, the node shows {len(devices)}")
        out[name] = ",".join(devices[at:at + n])
        at += n
    return out


@contextmanager
def member_server(plan: dict, name: str, models: Models, threads: int, log_dir: Path,
                  gpus: str | None = None) -> Iterator[Live]:
    """Start one member's server, check it loaded the MoE configs it should, yield it, stop it."""
    args = plan["members"][name]["args"]
    spec = server_spec(plan, models, threads)
    env: dict[str, str | None] = dict(plan["server"]["env"])
    tuned = args.get("moe_config") == "tuned"
    if tuned and models.moe_installed is None:
        raise SystemExit(f"settings.{name}.moe_config is tuned but no --moe-installed file was given")
    env["SGLANG_MOE_CONFIG_DIR"] = models.moe_installed["config_dir"] if tuned else None
    env.update(setting_env(args))  # a calibration setting's SGLANG_SIMULATE_ACC_LEN
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port(spec.host)
        url = f"http://{spec.host}:{port}"
        server = ServerProcess(build_command(spec, args, port), log_dir / f"{name}.log", url,
                               plan["server"]["startup_timeout_s"], env)
        try:
            server.start()
            break
        except ServerError:
            # another process took the port between its choice and the server's bind: choose another
            if attempt == PORT_ATTEMPTS or PORT_TAKEN not in server.log_since_start():
                raise
            log.warning("setting %s: port %d was taken before the server bound it; retrying on another", name, port)
    try:
        if tuned:
            from workflow_scripts.moe.verify import check_loaded

            check_loaded(server.log_since_start(), Path(models.moe_installed["file"]))
        yield Live(server, url, spec)
    finally:
        server.stop()
