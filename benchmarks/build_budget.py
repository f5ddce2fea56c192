"""Time the model-pair build against its budget: default <= 8 min, smoke <= 60 s, agreement >= 0.55.

Runs the real CLI in a subprocess per preset and reads the phase times and quality from build_info.json.
The machine's load average is printed beside each run, because a shared CPU stretches wall time.

    python -m benchmarks.build_budget [--presets smoke default] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = {"smoke": 60.0, "default": 480.0}
MIN_AGREEMENT = {"default": 0.55}


def run_build(preset: str, seed: int, root: Path) -> dict:
    """Build one pair with the CLI; return wall time, load and the build_info highlights."""
    target, draft = root / preset / "target", root / preset / "draft"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "workflow_scripts.models.build", "--preset", preset, "--seed", str(seed),
                    "--target-out", str(target), "--draft-out", str(draft)], check=True, timeout=3600)
    wall = time.perf_counter() - start
    info = json.loads((target / "build_info.json").read_text())
    training = info["training"]
    return {
        "preset": preset,
        "wall_s": round(wall, 1),
        "budget_s": BUDGET_S.get(preset),
        "load_avg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "phase_wall_s": {k: round(v["wall_s"], 1) for k, v in training.items()},
        "target_val_loss": info["quality"]["target_val_loss"],
        "draft_val_loss": info["quality"]["draft_val_loss"],
        "dense_val_loss_before_upcycle": info["quality"]["dense_val_loss_before_upcycle"],
        "agreement": info["draft_target_top1_agreement"],
        "min_agreement": MIN_AGREEMENT.get(preset),
        "distinct_experts_per_3_tokens": info["routing"]["distinct_experts_per_3_tokens_mean"],
        "uniform_random_expectation": info["routing"]["distinct_experts_per_3_tokens_if_uniform_random"],
        "parameters": info["parameters"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["smoke", "default"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="build here and keep the pairs (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        results = [run_build(p, args.seed, root) for p in args.presets]
    ok = True
    for r in results:
        within = r["budget_s"] is None or r["wall_s"] <= r["budget_s"]
        agrees = r["min_agreement"] is None or r["agreement"] >= r["min_agreement"]
        ok &= within and agrees
        print(json.dumps({**r, "within_budget": within, "agreement_ok": agrees}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
