"""A private one-node Slurm cluster (munged, slurmctld, slurmd) under one directory: for CI, and for trying the Slurm
profile on one machine.

Nothing system-wide is touched: the cluster has its own munge key and socket, its own ports, state and log directories,
and it talks over 127.0.0.1 only. Client commands reach it through wrapper scripts in ROOT/bin that set SLURM_CONF:
the jobstep plugin strips SLURM_* variables before its nested `srun`, so an exported SLURM_CONF alone would not reach it.

    python -m workflow_scripts.scaleout.local_slurm up /tmp/myslurm     # prints the PATH/SLURM_CONF exports
    python -m workflow_scripts.scaleout.local_slurm down /tmp/myslurm

Slurm 22.05 (Debian's `munge slurmctld slurmd slurm-client`); it must run as root (SlurmUser=root, no cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "srun")
NODE = "localnode"
MUNGE_USER = "munge"


def _search_path() -> str:
    """PATH plus the sbin directories, where Debian puts the daemons."""
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def missing_binaries() -> list[str]:
    """The Slurm/munge programs this cluster needs that are not installed."""
    return [name for name in DAEMONS + CLIENTS if shutil.which(name, path=_search_path()) is None]


def _which(name: str) -> str:
    found = shutil.which(name, path=_search_path())
    if found is None:
        raise FileNotFoundError(f"{name}: not found; install Debian's munge slurmctld slurmd slurm-client")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _total_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


@dataclass
class LocalSlurm:
    """One node (`localnode`, `cpus` CPUs) in one default partition, everything under `root`."""

    root: Path
    cpus: int = 2
    partition: str = "debug"
    real_memory_mb: int = field(default_factory=lambda: min(_total_memory_mb(), 32000))

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def _pids_file(self) -> Path:
        return self.root / "pids.json"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: os.environ) with the wrappers first on PATH and SLURM_CONF set."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["SLURM_CONF"] = str(self.conf)
        return env

    def start(self, timeout_s: float = 60) -> None:
        """Write the config, start the three daemons and wait until the node is idle."""
        if os.geteuid() != 0:
            raise PermissionError("local Slurm: must run as root (SlurmUser=root, munged runs as the munge user)")
        self.root.mkdir(parents=True, exist_ok=True)
        # munged checks that every directory above its socket is searchable by all
        self.root.chmod(0o755)
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        self._write_munge_key()
        self._write_conf()
        self._write_wrappers()
        munge = self.root / "munge"
        pids = {
            "munged": self._spawn(
                [
                    _which("munged"),
                    "-F",
                    f"--socket={munge / 'munge.socket'}",
                    f"--key-file={munge / 'munge.key'}",
                    f"--pid-file={munge / 'munged.pid'}",
                    f"--log-file={munge / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}",
                ],
                "munged",
                user=MUNGE_USER,
            )
        }
        self._pids_file.write_text(json.dumps(pids))
        self._wait(lambda: (munge / "munge.socket").exists(), timeout_s, "munged socket")
        pids["slurmctld"] = self._spawn([_which("slurmctld"), "-D", "-i"], "slurmctld")
        self._pids_file.write_text(json.dumps(pids))
        pids["slurmd"] = self._spawn([_which("slurmd"), "-D", "-N", NODE], "slurmd")
        self._pids_file.write_text(json.dumps(pids))
        self._wait(self._node_idle, timeout_s, f"node {NODE} idle")

    def stop(self, timeout_s: float = 30) -> None:
        """`scontrol shutdown` (stops slurmctld and slurmd), then munged; anything still up is killed by its PID."""
        if not self._pids_file.exists():
            return
        pids: dict[str, int] = json.loads(self._pids_file.read_text())
        if "slurmctld" in pids:
            # jobs outlive a slurmd shutdown: cancel what a killed Snakemake left behind (this cluster's jobs only)
            queued = subprocess.run(
                ["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True, text=True, timeout=timeout_s
            )
            if queued.stdout.split():
                subprocess.run(
                    ["scancel", *queued.stdout.split()], env=self.env(), capture_output=True, timeout=timeout_s
                )
            subprocess.run(["scontrol", "shutdown"], env=self.env(), capture_output=True, timeout=timeout_s)
        for name in ("slurmctld", "slurmd", "munged"):
            if name in pids:
                self._end(pids[name], terminate=name == "munged", timeout_s=timeout_s)
        self._pids_file.unlink()

    def __enter__(self) -> "LocalSlurm":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of each daemon's log, for error messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")) + [self.root / "munge" / "munged.log"]:
            if log.exists():
                parts.append(f"== {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def _write_munge_key(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(exist_ok=True)
        user = pwd.getpwnam(MUNGE_USER)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        for path in (munge, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        munge.chmod(0o755)
        key.chmod(0o400)

    def _write_conf(self) -> None:
        host = socket.gethostname()
        r = self.root
        lines = [
            "ClusterName=specstudy",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            # no cgroups in containers and CI runners
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            # without a default memory per CPU a job takes the whole node and jobs run one at a time
            "DefMemPerCPU=500",
            # squeue (the status command without accounting) sees finished jobs for this long: at least 3 x the
            # plugin's first status check, and longer than a test module that reads its jobs back
            "MinJobAge=1800",
            "KillWait=5",
            "ReturnToService=2",
            # trust the node line below instead of the probed hardware
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus}"
            f" RealMemory={self.real_memory_mb} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _write_wrappers(self) -> None:
        self.bin_dir.mkdir(exist_ok=True)
        for name in CLIENTS:
            wrapper = self.bin_dir / name
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {_which(name)} "$@"\n')
            wrapper.chmod(0o755)

    def _spawn(self, cmd: list[str], name: str, user: str | None = None) -> int:
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=[] if user else None,
            )
        return proc.pid

    def _node_idle(self) -> bool:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%t"], env=self.env(), capture_output=True, text=True, timeout=10
        )
        return proc.returncode == 0 and proc.stdout.strip() == "idle"

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"local Slurm: no {what} after {timeout_s:.0f} s\n{self.log_tail()}")
            time.sleep(0.5)

    @staticmethod
    def _end(pid: int, terminate: bool, timeout_s: float) -> None:
        """Wait for `pid` to exit (SIGTERM first if `terminate`), SIGKILL after the timeout; reap it if it is our child."""
        try:
            if terminate:
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        return
                except ChildProcessError:
                    os.kill(pid, 0)  # not our child: is it still there?
                time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        except ProcessLookupError:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument(
        "root", type=Path, help="directory for the cluster's config, state and logs (searchable by all)"
    )
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args(argv)
    cluster = LocalSlurm(args.root.resolve(), cpus=args.cpus)
    if args.action == "down":
        cluster.stop()
        return 0
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    print(f"export PATH={cluster.bin_dir}:$PATH SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
