"""Replays an acceptance trace through an adaptive rule and prints the tier before each verify and each switch.

`python adaptive_trace.py sglang|ours < {"config": path, "initial": steps, "trace": [[batch_size, [drafts...]], ...]}`:
`sglang` runs SGLang's own `AdaptiveSpeculativeParams` (the interpreter of SPECSTUDY_SGLANG_PYTHON), `ours` the
embedded engine's transcription, so that a test can compare the two decision for decision.
"""

from __future__ import annotations

import json
import sys


def replay(impl: str, job: dict) -> list[list]:
    if impl == "sglang":
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

        rule = AdaptiveSpeculativeParams(job["initial"], cfg_path=job["config"])
        steps_for = rule.get_steps_for_batch
    else:
        from workflow_scripts.engine.adaptive import AdaptiveSpeculativeParams, load_adaptive_config

        rule = AdaptiveSpeculativeParams(job["initial"], load_adaptive_config(job["config"]))
        steps_for = rule.steps_for_batch
    return [[steps_for(bs), rule.on_verify_complete(drafts, bs)] for bs, drafts in job["trace"]]


if __name__ == "__main__":
    json.dump(replay(sys.argv[1], json.load(sys.stdin)), sys.stdout)
