"""The smoke study under the faults a shared cluster throws at it, with what the user sees and what a rerun redoes.

    python -m benchmarks.faults [--keep DIR]

Each fault runs the real Snakemake on config/smoke.yaml (4 rounds, the engine's default MoE config, the smoke pair
built once and copied in) in a scratch folder, injects the fault while the benchmark measures, and prints one row:
the fault, seconds from the fault to its detection, the first line of the error the user saw, the finished cells
lost (finished before the fault, measured again after), and what the rerun redid. The tests of each fault are in
tests/client/test_run_cohort.py and tests/workflow/test_smoke_study.py; this script gives the figures.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def study_config() -> dict:
    config = copy.deepcopy(SMOKE)
    for setting in config["settings"].values():
        setting["moe_config"] = "default"
    config["moe"] = dict(config["moe"], tune=False)
    config["benchmark"] = dict(config["benchmark"], repeats=4, max_repeats=4)
    return config


class Study:
    """One scratch study folder with the smoke pair copied in."""

    def __init__(self, root: Path, name: str, pair: Path) -> None:
        self.dir = root / name
        self.results = self.dir / "results" / SMOKE["study"]
        shutil.copytree(pair, self.results / "models")
        (self.dir / "study.yaml").write_text(yaml.safe_dump(study_config()))

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(self.dir),
                "--configfile", str(self.dir / "study.yaml"), "--cores", "2", *args]

    def env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
                    PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), env=self.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), env=self.env(), capture_output=True, text=True, timeout=900)

    def job_log(self) -> str:
        logs = sorted((self.results / "logs" / "benchmark").glob("*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text(errors="replace") if logs else ""

    def cells(self) -> int:
        return len(list((self.results / "cells").glob("*/*/*.parquet")))

    def server_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"started server pid (\d+)", self.job_log())]


def wait_for(condition: Callable[[], object], timeout: float = 600) -> float:
    """Poll until `condition()` is true; the time it became so (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"{condition} still false after {timeout} s")


def first_error(text: str) -> str:
    for line in text.splitlines():
        if re.search(r"(\w+Error:|is gone|damaged|refused|cannot be locked|LockException|retrying)", line):
            return line.strip()[:140]
    return "(no error line)"


def rerun(study: Study, before: int, *args: str) -> tuple[int, str]:
    """Rerun the study; (finished cells lost, what the rerun measured)."""
    done = study.run(*args)
    if done.returncode != 0:
        return 0, f"rerun failed: {first_error(done.stdout + done.stderr)}"
    cached = [int(n) for n in re.findall(r"; (\d+) cached cell-rounds;", study.job_log())]
    reused = cached[-1] if cached else 0
    return max(before - reused, 0), f"{study.cells() - reused} cells measured, {reused} reused"


def mid_cell(study: Study) -> tuple[subprocess.Popen, int]:
    """Start the study and wait until its benchmark has finished a cell: (snakemake, cells finished)."""
    proc = study.start()
    wait_for(lambda: "cell " in study.job_log() and study.cells() > 0)
    return proc, study.cells()


def server_signal(study: Study, sig: signal.Signals) -> dict:
    proc, _ = mid_cell(study)
    os.killpg(study.server_pids()[0], sig)
    t0 = time.monotonic()
    detected = wait_for(lambda: "ServerError" in study.job_log() or proc.poll() is not None)
    proc.wait(timeout=300)
    saw = first_error(study.job_log())  # before the rerun overwrites the job's log
    before = study.cells()
    lost, redid = rerun(study, before)
    return {"detected_s": detected - t0, "user_saw": saw, "lost": lost, "rerun": redid}


def port_taken(study: Study) -> dict:
    proc = study.start()
    logs = study.results / "logs" / "server"
    port = wait_for_port(logs)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    t0 = time.monotonic()
    detected = wait_for(lambda: "retrying on another" in study.job_log() or proc.poll() is not None)
    code = proc.wait(timeout=600)
    squatter.close()
    line = next((ln for ln in study.job_log().splitlines() if "retrying on another" in ln), "(no retry)")
    return {"detected_s": detected - t0, "user_saw": line.split(" WARNING ")[-1][:140], "lost": 0,
            "rerun": "none needed: the job went on" if code == 0 else f"the run failed ({code})"}


def wait_for_port(logs: Path) -> int:
    found: list[int] = []

    def chosen() -> bool:
        for path in logs.glob("*/*.log"):
            found.extend(int(p) for p in re.findall(r"--port (\d+)", path.read_text(errors="replace")))
        return bool(found)

    wait_for(chosen)
    return found[0]


def truncated_cell(study: Study) -> dict:
    done = study.run()
    assert done.returncode == 0, done.stderr[-2000:]
    victim = sorted((study.results / "cells").glob("*/*/*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:200])
    before = study.cells()
    t0 = time.monotonic()
    lost, redid = rerun(study, before - 1, "--forcerun", "benchmark")
    line = next((ln for ln in study.job_log().splitlines() if "is unreadable" in ln), "(not detected)")
    return {"detected_s": time.monotonic() - t0, "user_saw": line.split(" WARNING ")[-1][:140], "lost": lost,
            "rerun": redid}


def corrupted_model(study: Study) -> dict:
    weights = study.results / "models" / "target" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    t0 = time.monotonic()
    done = study.run()
    last = study.job_log().strip().splitlines()[-1] if study.job_log().strip() else first_error(done.stderr)
    return {"detected_s": time.monotonic() - t0, "user_saw": last[:140], "lost": 0,
            "rerun": f"no cell ran ({study.cells()} measured); rebuild the pair, then rerun"}


def snakemake_killed(study: Study) -> dict:
    proc, _ = mid_cell(study)
    os.kill(proc.pid, signal.SIGKILL)  # Snakemake alone: its job goes on as an orphan
    t0 = time.monotonic()
    proc.wait()
    detected = wait_for(lambda: "is gone: stopping" in study.job_log(), timeout=120)
    time.sleep(2)  # the job stops its servers and exits
    saw = next(ln for ln in study.job_log().splitlines() if "is gone: stopping" in ln)
    half = list(study.results.glob("benchmark/*.parquet")) + list(study.results.glob("**/.*.tmp"))
    before = study.cells()
    lost, redid = rerun(study, before)
    note = ""
    if redid.startswith("rerun failed") and "LockException" in redid:  # Snakemake's lock outlives a SIGKILL
        study.run("--unlock")
        note = "needed `snakemake --unlock` first; "
        lost, redid = rerun(study, before)
    return {"detected_s": detected - t0, "user_saw": saw.strip()[:140], "lost": lost,
            "rerun": f"{note}{redid}; half-written outputs: {len(half)}"}


def second_snakemake(study: Study) -> dict:
    proc, _ = mid_cell(study)
    t0 = time.monotonic()
    second = study.run()
    detected = time.monotonic()
    proc.wait(timeout=600)
    refused = second.returncode != 0 and "LockException" in second.stdout + second.stderr
    line = next((ln for ln in (second.stdout + second.stderr).splitlines() if "lock" in ln.lower()), "(not refused)")
    return {"detected_s": detected - t0, "user_saw": line.strip()[:140], "lost": 0,
            "rerun": "nothing: the first run finished" if refused and proc.returncode == 0 else "CHECK"}


FAULTS = {
    "server SIGKILLed mid-cell": lambda s: server_signal(s, signal.SIGKILL),
    "server SIGSTOPped mid-cell (hang)": lambda s: server_signal(s, signal.SIGSTOP),
    "port taken before the server binds it": port_taken,
    "cached cell file truncated": truncated_cell,
    "model weights truncated": corrupted_model,
    "snakemake SIGKILLed mid-benchmark": snakemake_killed,
    "second snakemake on the same results": second_snakemake,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="keep the scratch studies here (default: a temporary folder)")
    parser.add_argument("--only", nargs="*", choices=list(FAULTS), help="run only these faults")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="faults-"))
    root.mkdir(parents=True, exist_ok=True)
    from workflow_scripts.models.build import build_pair

    pair = root / "pair"
    if not (pair / "target" / "build_info.json").is_file():
        build_pair("smoke", SMOKE["model"]["seed"], pair / "target", pair / "draft")
    rows = []
    for i, (name, inject) in enumerate(FAULTS.items()):
        if args.only and name not in args.only:
            continue
        print(f"[{i + 1}/{len(FAULTS)}] {name} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        row = inject(Study(root, f"fault{i}", pair))
        rows.append({"fault": name, **row})
    table = pd.DataFrame(rows)
    table["detected_s"] = table["detected_s"].map(lambda s: f"{s:.1f}")
    print(table.to_markdown(index=False))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
