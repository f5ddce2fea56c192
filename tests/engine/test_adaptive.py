"""SGLang's adaptive speculation rule: the transcription against SGLang's own code, and the engine running it."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from workflow_scripts.engine.types import SamplingParams, SpecConfig

from .adaptive_trace import replay
from .conftest import prompts, run_engine

SGLANG_PYTHON = os.environ.get("SPECSTUDY_SGLANG_PYTHON")
CONFIGS = {
    "sglang_default": None,
    "one_entry_top_level_knobs": {"ema_alpha": 0.3, "warmup_batches": 4, "update_interval": 3,
                                  "1": {"candidate_steps": [1, 2, 3, 4, 5]}},
    "ceiling_and_hysteresis": {"1": {"candidate_steps": [1, 2, 4, 6], "ceiling_coeff": 0.8, "up_hysteresis": 0.3,
                                     "down_hysteresis": -0.4, "warmup_batches": 3, "update_interval": 2}},
    "zero_tiers_by_batch": {"update_interval": 2, "warmup_batches": 2, "1": {"candidate_steps": [0, 2, 4]},
                            "4": {"candidate_steps": [2, 3]}, "16": {"candidate_steps": [0, 1]}},
}


def acceptance_trace(seed: int, verifies: int = 600) -> list[list]:
    """Phases of high, low and middling acceptance over batch sizes 1..40, every request's drafts drawn anew."""
    rng = random.Random(seed)
    trace = []
    for i in range(verifies):
        level = (6.5, 0.3, 2.5, 4.0, 0.0, 1.2)[(i // 60) % 6]
        bs = rng.choice((1, 1, 2, 3, 5, 8, 17, 40))
        trace.append([bs, [max(0, min(7, round(rng.gauss(level, 1.0)))) for _ in range(bs)]])
    return trace


@pytest.mark.skipif(not SGLANG_PYTHON, reason="SPECSTUDY_SGLANG_PYTHON is unset: `make .sgvenv` builds SGLang 0.5.23 "
                    "for CPU, and `make test` exports its python")
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_switches_where_sglangs_own_rule_does(name, seed, tmp_path):
    config = None
    if CONFIGS[name] is not None:
        config = str(tmp_path / "adaptive.json")
        Path(config).write_text(json.dumps(CONFIGS[name]))
    job = {"config": config, "initial": 3 if name == "sglang_default" else 2, "trace": acceptance_trace(seed)}
    script = Path(__file__).with_name("adaptive_trace.py")
    done = subprocess.run([SGLANG_PYTHON, str(script), "sglang"], input=json.dumps(job), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    ours = replay("ours", job)
    switches = [i for i, (_, new) in enumerate(ours) if new is not None]
    assert len(switches) >= 4, f"the trace should make the rule switch tiers, it switched at {switches}"
    assert ours == theirs


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=48, ignore_eos=True)


def adaptive(steps: int, draft, config: dict) -> SpecConfig:
    return SpecConfig("STANDALONE", steps, 1, steps + 1, draft, adaptive_config=config)


def test_engine_climbs_with_a_perfect_draft_and_stays_lossless(target_dir, engine_factory):
    """The target as its own draft: every draft accepted, so the rule climbs from tier 1 to 3 (3 drafts accepted in
    one verify happen only there); the output is the plain greedy one throughout."""
    expected, _ = run_engine(engine_factory(target_dir, None, 2, 0), prompts(2), GREEDY)
    config = {"warmup_batches": 2, "update_interval": 2, "1": {"candidate_steps": [1, 2, 3]}}
    engine = engine_factory(target_dir, adaptive(1, target_dir, config), 2, 0)
    outs, finals = run_engine(engine, prompts(2), GREEDY)
    assert outs == expected
    assert engine.stats()["total_adaptive_switches"] >= 2
    assert all(len(f.spec_correct_drafts_histogram) == 4 and f.spec_correct_drafts_histogram[3] > 0 for f in finals)


def test_engine_drops_to_its_zero_tier_with_a_poor_draft(target_dir, dense_draft_dir, engine_factory):
    """An unrelated draft is rejected almost always: the rule falls to 0 steps, where the engine decodes plainly (no
    verify), and probes tier 2 again every update interval."""
    expected, _ = run_engine(engine_factory(target_dir, None, 2, 0), prompts(2), GREEDY)
    config = {"warmup_batches": 2, "update_interval": 4, "1": {"candidate_steps": [0, 2]}}
    engine = engine_factory(target_dir, adaptive(2, dense_draft_dir, config), 2, 0)
    outs, finals = run_engine(engine, prompts(2), GREEDY)
    assert outs == expected
    assert engine.stats()["total_adaptive_switches"] >= 2
    for f in finals:  # tokens a verify did not commit came from 0-step plain decodes: 4 of every 8 forwards or so
        plain = f.completion_tokens - f.spec_verify_ct - f.spec_accepted_drafts
        assert plain > 0.3 * f.completion_tokens

