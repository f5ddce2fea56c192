"""SGLang 0.5.23's own ServerArgs parses every command line the launcher builds: static settings and adaptive ones."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from workflow_scripts.launcher.command import ServerSpec, build_command, check_setting

SGLANG_PYTHON = os.environ.get("SPECSTUDY_SGLANG_PYTHON")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not SGLANG_PYTHON,
    reason="SPECSTUDY_SGLANG_PYTHON is unset: `make .sgvenv` installs SGLang 0.5.23 for CPU and `make test` exports it",
)


def study_settings(adaptive_config: str) -> dict[str, dict]:
    """Every setting of every study config in config/, by `config:setting`. An adaptive config that a study writes
    (under results/, e.g. a deployed schedule) is not there before that study runs: `adaptive_config` stands in."""
    out = {}
    for path in sorted((ROOT / "config").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        if path.name != "schema.yaml" and isinstance(cfg, dict):
            out.update({f"{path.stem}:{name}": s or {} for name, s in (cfg.get("settings") or {}).items()})
    for setting in out.values():
        if str(setting.get("speculative_adaptive_config") or "").startswith("results/"):
            setting["speculative_adaptive_config"] = adaptive_config
    return out


def adaptive_settings(config_path: str) -> dict[str, dict]:
    """Adaptive forms SGLang adapts (EAGLE/EAGLE3, topk 1): default tiers, a config file, a start tier, a schedule."""
    steps = {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}
    return {
        "eagle_default_tiers": {"speculative_algorithm": "EAGLE", "speculative_adaptive": True},
        "eagle3_config": {"speculative_algorithm": "EAGLE3", "speculative_adaptive": True,
                          "speculative_adaptive_config": config_path},
        "eagle_config_start_tier": {"speculative_algorithm": "EAGLE", "speculative_adaptive": True,
                                    "speculative_adaptive_config": config_path, **steps},
    }


def test_sglang_parses_every_setting(tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 2, 3]}, "8": {"candidate_steps": [0, 1]}}))
    settings = {**study_settings(str(config)), **adaptive_settings(str(config))}
    spec = ServerSpec("sglang", "/ckpt/target", "/ckpt/draft", "127.0.0.1", 32, 0, sglang_python=SGLANG_PYTHON,
                      mem_fraction_static=0.8)
    argvs = {}
    for name, setting in settings.items():
        check_setting(name, setting, "sglang" if name.startswith("eagle") else "embedded")
        argvs[name] = build_command(spec, setting, port=30000)[3:]
    assert any("--speculative-adaptive" in argv for argv in argvs.values())
    done = subprocess.run([SGLANG_PYTHON, str(Path(__file__).with_name("sglang_parse.py"))],
                          input=json.dumps(list(argvs.values())), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    for (name, argv), parsed in zip(argvs.items(), json.loads(done.stdout)):
        for i, flag in enumerate(argv):
            if not flag.startswith("--"):
                continue
            key = flag[2:].replace("-", "_")
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
            assert str(parsed[key]) == str(value), f"{name}: SGLang read {flag} as {parsed[key]!r}, not {value!r}"
