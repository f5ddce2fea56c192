"""SGLang's adaptive speculative decoding (`--speculative-adaptive`, `--speculative-adaptive-config`), transcribed.

Source: SGLang 0.5.23, `sglang/srt/speculative/adaptive_spec_params.py` (`AdaptiveStepSlot`,
`AdaptiveSpeculativeParams`, `_load_adaptive_config`, `adaptive_unsupported_reason`) and
`sglang/srt/arg_groups/speculative_hook.py` (`_init_adaptive_speculative_params`). The rule:
- the config maps batch sizes ("1", "8", ...: each key is the smallest batch its entry serves, the batch-size-aware
  variant) to candidate step tiers plus knobs; top-level knobs apply to every entry that does not set its own;
- each entry keeps an EMA of accepted drafts per request (bonus not counted; `ema_alpha`), updated after every
  verify of a batch routed to it, and after `warmup_batches` it re-picks its tier every `update_interval` verifies:
  down while the EMA is at most (next lower tier - 0.5 + down_hysteresis; 0.5 for tier 0), else up while it is above
  (current tier - 0.5 + up_hysteresis); a 0-step tier always probes the next tier up; `ceiling_coeff` > 0 caps a
  non-rising choice at ceil(EMA × coeff);
- a decode batch of B requests uses the entry with the largest key <= B (the smallest key below that).
The embedded engine has no CUDA graphs, so SGLang's padding of B to a captured graph size does not apply.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path

# SGLang's DEFAULT_ADAPTIVE_CONFIG: used when --speculative-adaptive comes without a config file
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}
# what SGLang 0.5.23 adapts; for anything else it logs "speculative_adaptive disabled" and runs static steps
SGLANG_ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")


def adaptive_unsupported_reason(algorithm: str | None, topk: int | None) -> str | None:
    """Why SGLang would not adapt these settings (its `adaptive_unsupported_reason`, the parts a study sets)."""
    if algorithm not in SGLANG_ADAPTIVE_ALGORITHMS:
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    return None


def batch_entries(cfg: dict) -> dict[int, dict]:
    """The batch-size entries of a config, validated as SGLang does (ValueError with its wording)."""
    entries: dict[int, dict] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        entries[int(key)] = entry
    if not entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, "
            f'e.g. {{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg)}'
        )
    return entries


def load_adaptive_config(path: str | Path | None) -> dict:
    """The JSON config at `path`, or SGLang's default when None."""
    return json.loads(Path(path).read_text()) if path is not None else DEFAULT_ADAPTIVE_CONFIG


def candidate_steps(cfg: dict) -> list[int]:
    """Every entry's tiers together: SGLang's `resolve_candidate_steps_from_config`."""
    return sorted({s for entry in batch_entries(cfg).values() for s in entry["candidate_steps"]})


def initial_steps(cfg: dict, steps: int | None) -> int:
    """--speculative-num-steps under adaptive: SGLang's middle tier when unset; a set one must be a tier."""
    tiers = candidate_steps(cfg)
    if steps is None:
        return tiers[len(tiers) // 2]
    if steps not in tiers:
        raise ValueError(
            f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps {tiers}. Pass one of those values."
        )
    return steps


def route(sizes: list[int], batch_size: int) -> int:
    """The batch-size key (of `sizes`, sorted) whose entry serves a decode batch of `batch_size`: the largest key <=
    it, else the smallest key."""
    return sizes[max(0, bisect.bisect_right(sizes, batch_size) - 1)]


class AdaptiveStepSlot:
    """One batch-size entry: an EMA of accepted drafts choosing among its candidate tiers."""

    def __init__(self, initial: int, cfg: dict):
        self.candidate_steps = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = cfg.get("ema_alpha", 0.2)
        self.update_interval = cfg.get("update_interval", 5)
        self.warmup_batches = cfg.get("warmup_batches", 10)
        self.down_hysteresis = cfg.get("down_hysteresis", -0.25)
        self.up_hysteresis = cfg.get("up_hysteresis", 0.0)
        self.ceiling_coeff = cfg.get("ceiling_coeff", 0)
        if initial in self.candidate_steps:
            self.current_steps = initial
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, correct_drafts: list[int]) -> bool:
        """Feed one verify's accepted drafts per request; True when the tier changed."""
        if not correct_drafts:
            return False
        if self.current_steps > 0:
            batch_avg = sum(correct_drafts) / len(correct_drafts)
            self.ema_accept_len = (1 - self.ema_alpha) * self.ema_accept_len + self.ema_alpha * batch_avg
        self._batch_count += 1
        if self._batch_count <= self.warmup_batches:
            return False
        if (self._batch_count - self.warmup_batches) % self.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        old = self.current_steps
        idx = old_idx = self.candidate_steps.index(old)
        if old == 0:  # probe the smallest positive tier after a no-speculation interval
            idx = min(idx + 1, len(self.candidate_steps) - 1)
            target = self.candidate_steps[idx]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply(target)
        while idx > 0:
            lower = self.candidate_steps[idx - 1]
            threshold = (0.5 if lower == 0 else lower - 0.5) + self.down_hysteresis
            if self.ema_accept_len > threshold:
                break
            idx -= 1
        if idx == old_idx:
            while idx < len(self.candidate_steps) - 1:
                if self.ema_accept_len <= self.candidate_steps[idx] - 0.5 + self.up_hysteresis:
                    break
                idx += 1
        target = self.candidate_steps[idx]
        if self.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema_accept_len * self.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and self.candidate_steps[idx] > ceiling:
                    idx -= 1
                target = self.candidate_steps[idx]
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        changed = target != self.current_steps
        self.current_steps = target
        return changed


class AdaptiveSpeculativeParams:
    """Routes a decode batch to its batch-size entry; the scheduler asks it for the steps and feeds it verifies."""

    def __init__(self, initial: int, cfg: dict):
        entries = batch_entries(cfg)
        self._bs_list = sorted(entries)
        self._slots = {bs: AdaptiveStepSlot(initial, {**cfg, **entries[bs]}) for bs in self._bs_list}

    @property
    def candidate_steps(self) -> list[int]:
        return sorted({s for slot in self._slots.values() for s in slot.candidate_steps})

    def steps_for_batch(self, batch_size: int) -> int:
        return self._route(batch_size).current_steps

    def on_verify_complete(self, correct_drafts: list[int], batch_size: int) -> int | None:
        """The new tier of the batch's entry when this verify switched it, else None."""
        slot = self._route(batch_size)
        return slot.current_steps if slot.update(correct_drafts) else None

    def _route(self, batch_size: int) -> AdaptiveStepSlot:
        return self._slots[route(self._bs_list, batch_size)]
