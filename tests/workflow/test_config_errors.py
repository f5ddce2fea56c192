"""A bad config fails before any job runs, with a message that names the key and what is allowed."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.workflow.snakemake_run import REPO, snakemake

GOOD = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def _adaptive_file(text: str) -> str:
    """An adaptive config file for a case (module scope: the cases are built at import)."""
    path = Path(tempfile.mkdtemp(prefix="adaptive-")) / "adaptive.json"
    path.write_text(text)
    return str(path)


def _adaptive(config: dict, **keys) -> None:
    config["settings"]["steps2"].update(speculative_adaptive=True, **keys)


def with_edit(edit) -> dict:
    config = copy.deepcopy(GOOD)
    edit(config)
    return config


CASES = [
    ("unknown top-level key", lambda c: c.update(colour="blue"), ["'colour' was unexpected", "allowed keys: study, engine"]),
    (
        "unknown setting key",
        lambda c: c["settings"]["steps1"].update(speculative_num_stepz=2),
        ["config key settings.steps1", "speculative_num_stepz", "allowed keys: speculative_algorithm"],
    ),
    (
        "bad pairwise",
        lambda c: c.update(analysis={"pairwise": 3}),
        ["config key analysis.pairwise", "allowed: auto (steps N against steps N-1"],
    ),
    ("wrong type", lambda c: c["benchmark"].update(concurrency="many"), ["config key benchmark.concurrency", "'many' is not of type 'array'"]),
    (
        "setting names a missing workload",
        lambda c: c["settings"]["baseline"].update(workloads=["chat"]),
        ["settings.baseline.workloads", "'chat'", "allowed: synthetic, realistic"],
    ),
    (
        "draft tokens inconsistent with steps",
        lambda c: c["settings"]["steps2"].update(speculative_num_draft_tokens=5),
        ["settings.steps2", "speculative_num_draft_tokens must be speculative_num_steps + 1 = 3"],
    ),
    (
        "only some speculation flags",
        lambda c: c["settings"]["steps1"].pop("speculative_eagle_topk"),
        ["settings.steps1", "together or not at all", "speculative_eagle_topk"],
    ),
    (
        "speculation flags without an algorithm",
        lambda c: c["settings"]["baseline"].update(speculative_num_steps=2),
        ["settings.baseline", "speculative_num_steps is set but speculative_algorithm is not"],
    ),
    (
        "unknown algorithm",
        lambda c: c["settings"]["steps1"].update(speculative_algorithm="MEDUSA"),
        ["config key settings.steps1.speculative_algorithm", "'MEDUSA' is not one of"],
    ),
    ("baseline not a setting", lambda c: c.update(analysis={"baseline": "nope"}), ["analysis.baseline", "'nope'"]),
    ("precision target not positive", lambda c: c["benchmark"].update(precision_pct=0),
     ["config key benchmark.precision_pct", "0 is less than or equal to the minimum of 0"]),
    ("equivalence margin not positive", lambda c: c["benchmark"].update(equivalence_pct=-1),
     ["config key benchmark.equivalence_pct", "-1 is less than or equal to the minimum of 0"]),
    ("time box not positive", lambda c: c["benchmark"].update(cell_seconds=0),
     ["config key benchmark.cell_seconds", "0 is less than or equal to the minimum of 0"]),
    ("unknown allocation", lambda c: c["benchmark"].update(allocation="uneven"),
     ["config key benchmark.allocation", "'uneven' is not one of ['racing', 'even']"]),
    ("fewer rounds allowed than required", lambda c: c["benchmark"].update(repeats=3, max_repeats=2),
     ["benchmark.max_repeats: 2 is below benchmark.repeats (3)"]),
    ("unknown schedule", lambda c: c["benchmark"].update(schedule="weekly"),
     ["config key benchmark.schedule", "'weekly' is not one of"]),
    ("overlapping bands", lambda c: c.setdefault("analysis", {}).update(bands={"low": [1, 4], "mid": [4, 16]}),
     ["analysis.bands.mid: starts at 4, not above band low's last concurrency 4"]),
    ("unsorted bands", lambda c: c.setdefault("analysis", {}).update(bands={"high": [16], "low": [1]}),
     ["analysis.bands.low: starts at 1, not above band high's last concurrency 16"]),
    ("adaptive tier above the allowed steps",
     lambda c: _adaptive(c, speculative_adaptive_config=_adaptive_file('{"1": {"candidate_steps": [2, 17]}}')),
     ["settings.steps2.speculative_adaptive_config: tier 17 is above speculative_num_steps' maximum 16"]),
    ("adaptive config with a batch size twice",
     lambda c: _adaptive(c, speculative_adaptive_config=_adaptive_file(
         '{"1": {"candidate_steps": [2]}, "8": {"candidate_steps": [1]}, "1": {"candidate_steps": [3]}}')),
     ["settings.steps2.speculative_adaptive_config", "a batch-size key appears twice (['1'])"]),
    ("adaptive config with unsorted batch sizes",
     lambda c: _adaptive(c, speculative_adaptive_config=_adaptive_file(
         json.dumps({"8": {"candidate_steps": [1]}, "1": {"candidate_steps": [2]}}))),
     ["settings.steps2.speculative_adaptive_config", "batch-size keys must be in increasing order, got [8, 1]"]),
    ("adaptive with a topk SGLang refuses",
     lambda c: _adaptive(c, speculative_eagle_topk=2, speculative_num_draft_tokens=4),
     ["settings.steps2.speculative_eagle_topk: 2 with speculative_adaptive; SGLang adapts topk 1 only"]),
    ("adaptive start steps not a tier", lambda c: _adaptive(c, speculative_num_steps=2, speculative_adaptive_config=(
        _adaptive_file('{"1": {"candidate_steps": [1, 3]}}'))),
     ["settings.steps2.speculative_num_steps: 2 is not one of the adaptive tiers [1, 3]"]),
    ("adaptive STANDALONE on SGLang", lambda c: (_sglang_interleaved(c), c["benchmark"].update(schedule="blocked"),
                                                _adaptive(c)),
     ["settings.steps2.speculative_algorithm: SGLang 0.5.23 does not adapt speculative_algorithm=STANDALONE"]),
    ("a setting named like the A/A twin", lambda c: c["settings"].update(baseline_aa={}),
     ["settings.baseline_aa: the name is taken by the A/A twin of analysis.baseline"]),
    ("a sliced schedule on SGLang", lambda c: (_sglang_interleaved(c), c["benchmark"].update(schedule="sliced")),
     ["benchmark.schedule: sliced freezes each server outside its turn, which only the embedded engine allows"]),
    ("interleaved SGLang servers that need more GPUs than the node has", lambda c: _sglang_interleaved(c),
     ["benchmark.schedule: interleaved runs every setting's server at once; 5 SGLang servers need 10 GPUs but"
      " sglang.node_gpus is 4"]),
]


def _sglang_interleaved(config: dict) -> None:
    config.update(engine="sglang", sglang={"model_path": "/models/m", "draft_path": "/models/d", "tp_size": 2,
                                           "node_gpus": 4}, moe={"tune": False})
    config["benchmark"]["schedule"] = "interleaved"
    for setting in config["settings"].values():
        setting["moe_config"] = "default"


@pytest.mark.parametrize("name,edit,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_config_fails_before_any_job(tmp_path, name, edit, expected):
    proc = snakemake(tmp_path, with_edit(edit), "-n", "--cores", "1", check=False, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for fragment in expected:
        assert fragment in out, f"{fragment!r} not in:\n{out[-3000:]}"
    assert not (tmp_path / "results").exists()


def test_good_config_plans_the_full_dag(tmp_path):
    proc = snakemake(tmp_path, GOOD, "-n", "--cores", "1", timeout=120)
    assert "benchmark" in proc.stdout and "build_models" in proc.stdout
