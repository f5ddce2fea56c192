"""The MoE rules run for real under Snakemake on the embedded engine (tiny model, 2 shards), and a rerun
after a lost shard redoes only that shard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _snakemake(workdir: Path, *targets: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "study.yaml"), "--cores", "1", *targets]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_embedded_moe_rules_tune_install_and_rerun_one_shard(tiny_moe_model, tmp_path):
    study = {
        "study": "moe-rules", "engine": "embedded", "model": {"preset": "smoke"},
        "settings": {"baseline": {"moe_config": "tuned"}, "baseline_moe_default": {"moe_config": "default"}},
        "workloads": {"synthetic": {"kind": "synthetic"}},
        "moe": {"tune": True, "search": "halving", "batch_sizes": [1, 2, 4], "shards": 2},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    results = tmp_path / "results" / "moe-rules"
    shutil.copytree(tiny_moe_model, results / "models" / "target")  # stands in for the built pair (not a target here)
    (results / "models" / "draft").mkdir()
    moe = results / "moe"
    done = _snakemake(tmp_path, "results/moe-rules/moe/installed.json", "results/moe-rules/moe/roofline.svg")
    assert done.returncode == 0, done.stderr[-3000:]
    installed = json.loads((moe / "installed.json").read_text())
    assert Path(installed["file"]).is_file() and installed["E"] == 4 and installed["N"] == 8
    assert sorted(json.loads(Path(installed["file"]).read_text())) == ["1", "2", "4"]
    assert json.loads((moe / "shards" / "0.json").read_text())["batch_sizes"] == [1, 4]

    # as after a crash of shard 1: its atomic write left nothing, and merge/install never ran
    kept = (moe / "shards" / "0.json").stat().st_mtime_ns
    for path in (moe / "shards" / "1.json", moe / "merged.json", moe / "installed.json"):
        path.unlink()
    shutil.rmtree(moe / "configs")
    again = _snakemake(tmp_path, "results/moe-rules/moe/installed.json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("rule moe_tune_shard:") == 1 and (moe / "shards" / "1.json").is_file()
    assert (moe / "shards" / "0.json").stat().st_mtime_ns == kept
