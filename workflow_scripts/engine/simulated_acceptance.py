"""SGLang's `SGLANG_SIMULATE_ACC_LEN`: every verify accepts a set number of tokens, whatever the draft proposed.

Transcribed from SGLang 0.5.23, `sglang/srt/speculative/spec_utils.py` (`sample_simulated_acc_len`,
`generate_simulated_accept_index`) and its call in `sglang/srt/speculative/eagle_utils.py`:
- the value counts the bonus token: `SGLANG_SIMULATE_ACC_LEN=k` commits k tokens per verify, i.e. k - 1 accepted
  drafts (SGLang sets `num_correct_drafts = k - 1`), clamped to 1..steps + 1; a value <= 0 turns it off;
- a fractional value is drawn once per verify batch, the same for every row: `match-expected` (the default) takes
  floor or ceil with the weights that keep the mean, `multinomial` rounds a normal draw around it (std 1);
- `SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed` (the default) commits token id 100 in every place; `real-draft-token`
  commits the draft's own tokens and then the target's argmax at the bonus position (also for sampled requests).
It separates the cost of a step from the draft's acceptance: with `real-draft-token` the forwards see real text (a
repeated token id would route every position to the same experts, which flatters an MoE verify), and at T = 0 the
output is the plain greedy output wherever k - 1 is what the draft would have had accepted anyway.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

ENV_LEN, ENV_METHOD, ENV_TOKEN_MODE = "SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE"
METHODS = ("match-expected", "multinomial")
TOKEN_MODES = ("fixed", "real-draft-token")
FIXED_TOKEN = 100  # SGLang's "some legit token id"; a vocabulary of <= 100 ids takes its last id instead


@dataclass(frozen=True)
class SimulatedAcceptance:
    """The three environment variables, read once when the engine starts (SGLang reads them at import)."""

    length: float
    method: str = "match-expected"
    token_mode: str = "fixed"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> SimulatedAcceptance | None:
        """None when SGLANG_SIMULATE_ACC_LEN is unset or <= 0; ValueError naming the variable for a bad value."""
        raw = env.get(ENV_LEN, "").strip()
        if not raw:
            return None
        try:
            length = float(raw)
        except ValueError:
            raise ValueError(f"{ENV_LEN} must be a number, got {raw!r}") from None
        method = env.get(ENV_METHOD, METHODS[0])
        token_mode = env.get(ENV_TOKEN_MODE, TOKEN_MODES[0])
        if method not in METHODS:
            raise ValueError(f"{ENV_METHOD} must be one of {METHODS}, got {method!r}")
        if token_mode not in TOKEN_MODES:
            raise ValueError(f"{ENV_TOKEN_MODE} must be one of {TOKEN_MODES}, got {token_mode!r}")
        return cls(length, method, token_mode) if length > 0 else None

    def sample_len(self, max_len: int, generator: torch.Generator) -> int:
        """Tokens this verify commits (bonus included), in 1..max_len: SGLang's `sample_simulated_acc_len`."""
        if self.method == "multinomial":
            value = torch.normal(self.length, 1.0, (1,), generator=generator).clamp(1.0, max_len)
            return int(value.round().item())
        value = max(1.0, min(float(max_len), self.length))
        lower = int(value // 1)
        if lower >= max_len or value == lower:
            return lower
        upper_weight = value - lower
        pick = torch.multinomial(torch.tensor([1.0 - upper_weight, upper_weight]), 1, generator=generator)
        return lower + int(pick.item())

    def accept(self, drafts: torch.Tensor, target_logits: torch.Tensor, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Override a verify's outcome: (accepted drafts [B], next token [B], the drafts to commit [B, K])."""
        B, K = drafts.shape
        m = self.sample_len(K + 1, generator) - 1
        accepted = torch.full((B,), m, dtype=torch.long)
        if self.token_mode == "fixed":
            token = min(FIXED_TOKEN, target_logits.shape[-1] - 1)
            return accepted, torch.full((B,), token, dtype=torch.long), torch.full_like(drafts, token)
        return accepted, target_logits[:, m].argmax(-1), drafts
