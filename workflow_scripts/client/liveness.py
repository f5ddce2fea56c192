"""Whether what a cohort job depends on is still there: its servers (alive and answering) and the Snakemake that
started it. A job whose server hung, or whose Snakemake was killed, stops at once rather than measure on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp

from workflow_scripts.launcher.process import ServerError, ServerProcess, log_tail

# the liveness check beside a running cell (watch): every 2 s, 5 s to answer, 3 misses in a row = hung
HANG_EVERY_S, HANG_TIMEOUT_S, HANG_CHECKS = 2.0, 5.0, 3


async def watch(server: ServerProcess, url: str, _cell_session: aiohttp.ClientSession) -> None:
    """Beside a running cell: a server that exits, or stops answering /health (a hang, e.g. SIGSTOP), fails the job
    within ~HANG_CHECKS x (HANG_EVERY_S + HANG_TIMEOUT_S), long before the request timeout would. It asks on a
    session of its own: the cell's connections are all held by its requests, hung ones included."""
    missed = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HANG_TIMEOUT_S)) as session:
        while True:
            await asyncio.sleep(HANG_EVERY_S)
            server.raise_if_dead("died during a cell")
            try:
                async with session.get(url + "/health") as resp:
                    missed = 0 if resp.status == 200 else missed + 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                missed += 1
            if missed >= HANG_CHECKS:
                raise ServerError(f"server at {url} stopped answering /health during a cell ({missed} checks in a"
                                  f" row); log {server.log_path} ends with:\n{log_tail(server.log_path)}")


def check_supervisor(supervisor: int | None) -> None:
    """Stop when the Snakemake that started this job (`--supervisor-pid`) is gone."""
    if supervisor and not pid_alive(supervisor):
        # Snakemake was killed (SIGKILL leaves its jobs running): stop, so its rerun measures alone
        raise SystemExit(f"the Snakemake process that started this job (pid {supervisor}) is gone: stopping")


def pid_alive(pid: int) -> bool:
    """Whether the process runs; a zombie (killed, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): signal 0 is all we know
        return True


def exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (Snakemake cancelling, Slurm pre-empting) unwinds like Ctrl-C: every server is stopped, none orphaned."""
    raise SystemExit(128 + signum)
