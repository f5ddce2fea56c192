"""Drive SGLang's (patched) fused-MoE tuner for one shard of batch sizes on one GPU.

The tuner is run once per batch size, each time in a fresh working directory: it writes its result
under its own file name into the current directory, and a per-batch-size run works with every tuner
version (older ones take one `--batch-size` only). A GPU slot is claimed with a lock file, so shards
never share a GPU even when there are more shards than GPUs.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workflow_scripts.moe.model_shapes import MoeShape
from workflow_scripts.moe.naming import parse_config_file_name
from workflow_scripts.moe.patch_tuner import TUNER_SCRIPT

_PROBE = (
    "import json, torch, triton; "
    "print(json.dumps({'triton_version': triton.__version__, 'device_name': torch.cuda.get_device_name()}))"
)
_SPACE = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from common_utils import get_configs_compute_bound; print(json.dumps(get_configs_compute_bound()))"
)


class TunerRunError(RuntimeError):
    """The tuner failed or wrote something unexpected; the message names the command and its log."""


@contextmanager
def gpu_slot(lock_dir: Path, gpus: int, preferred: int, timeout_s: float) -> Iterator[int]:
    """Hold an exclusive lock on one of `gpus` GPU slots (the preferred one first) while the block runs."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    order = [(preferred + k) % gpus for k in range(gpus)]
    deadline = time.monotonic() + timeout_s
    while True:
        for gpu in order:
            handle = open(lock_dir / f"gpu{gpu}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield gpu
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no free GPU slot among {gpus} in {lock_dir} after {timeout_s:.0f} s")
        time.sleep(1.0)


def probe(python: str, env: dict[str, str]) -> dict:
    """Triton version and device name as the SGLang interpreter sees them (they name the installed file)."""
    done = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise TunerRunError(f"sglang.python {python}: cannot import torch+triton or see a GPU:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def full_space(python: str, tuner_dir: Path) -> list[dict]:
    """The tuner's own exhaustive space (get_configs_compute_bound in its common_utils.py)."""
    done = subprocess.run([python, "-c", _SPACE, str(tuner_dir)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise TunerRunError(f"{tuner_dir}/common_utils.py: get_configs_compute_bound() failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pruned_space(space: list[dict], M: int, shape: MoeShape) -> list[dict]:
    """The configs whose BLOCK_SIZE_M fits the rows one expert gets at M tokens (the rest pad with zeros).

    SGLang's tuner reports only the winner, never per-config times, so successive halving cannot steer
    it; on GPUs the pruned search is this shape rule over the same space instead.
    """
    rows = math.ceil(M * shape.top_k / shape.num_experts)
    bound = max(16, 1 << max(0, rows - 1).bit_length())
    kept = [c for c in space if c["BLOCK_SIZE_M"] <= bound]
    return kept or space


def tuner_command(python: str, tuner_dir: Path, model: str, shape: MoeShape, tp_size: int, ep_size: int,
                  M: int, seed: int, space_file: Path | None) -> list[str]:
    """argv of one tuner run for batch size M (the tuner's --tp-size defaults to 2: always pass it)."""
    argv = [python, str(tuner_dir / TUNER_SCRIPT), "--model", model, "--tp-size", str(tp_size),
            "--ep-size", str(ep_size), "--dtype", shape.kernel_dtype or "auto", "--batch-size", str(M),
            "--tune", "--seed", str(seed)]
    if space_file is not None:
        argv += ["--search-space-file", str(space_file)]
    return argv


def run_tuner(argv: list[str], env: dict[str, str], workdir: Path, M: int, timeout_s: float) -> tuple[str, dict]:
    """Run one tuner command in `workdir`; returns (its output file name, its config for M)."""
    workdir.mkdir(parents=True, exist_ok=True)
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=workdir, env=env, stdout=sys.stderr, stderr=sys.stderr, timeout=timeout_s)
    if done.returncode != 0:
        raise TunerRunError(f"tuner exited with {done.returncode} at batch size {M}: {' '.join(argv)} (see this job's log)")
    written = sorted(workdir.glob("E=*.json"))
    if len(written) != 1:
        raise TunerRunError(f"{workdir}: expected one E=...json from the tuner, found {[p.name for p in written]}")
    parse_config_file_name(written[0].name)
    configs = json.loads(written[0].read_text())
    if str(M) not in configs:
        raise TunerRunError(f"{written[0]}: no entry for batch size {M} (keys {sorted(configs)})")
    return written[0].name, configs[str(M)]


def tune_shard_sglang(*, python: str, tuner_dir: Path, model: str, shape: MoeShape, tp_size: int, ep_size: int,
                      batch_sizes: list[int], search: str, seed: int, gpu: int | None, timeout_s: float) -> dict:
    """Tune `batch_sizes` on GPU `gpu` (None: the GPU the scheduler gave this job); the shard record (same layout
    as the CPU tuner's)."""
    env = dict(os.environ) if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    info = probe(python, env)
    space = full_space(python, tuner_dir) if search == "halving" else None
    results: dict[int, dict] = {}
    names = set()
    with tempfile.TemporaryDirectory(prefix="moe-tune-") as tmp:
        for M in batch_sizes:
            space_file = None
            if space is not None:
                space_file = Path(tmp) / f"space_{M}.json"
                kept = pruned_space(space, M, shape)
                space_file.write_text(json.dumps(kept))
            started = time.perf_counter()
            argv = tuner_command(python, tuner_dir, model, shape, tp_size, ep_size, M, seed, space_file)
            name, config = run_tuner(argv, env, Path(tmp) / f"bs{M}", M, timeout_s)
            names.add(name)
            results[M] = {"config": config, "tuning_s": time.perf_counter() - started,
                          "space_size": len(kept) if space is not None else None}
    if len(names) != 1:
        raise TunerRunError(f"the tuner wrote different file names across batch sizes: {sorted(names)}")
    return {"file_name": names.pop(), "device_name": info["device_name"], "triton_version": info["triton_version"],
            "gpu": gpu, "results": results}
