"""A request's state while the engine holds it, shared by the scheduler and the drafters.

Its own module (SGLang keeps its `Req` in `managers/schedule_batch.py`, apart from the scheduler) so that
the drafters can name it without importing the scheduler that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from workflow_scripts.engine.types import SamplingParams, TokenEvent


@dataclass
class Sequence:
    """A request's tokens, KV slot and speculation counters."""

    rid: str
    tokens: list[int]  # prompt + committed output; once decoding, the last token is not yet in the target cache
    prompt_len: int
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    slot: int = -1
    prefilled: int = 0  # prompt positions already in the target cache (< prompt_len while its prefill is chunked)
    draft_len: int = 0  # positions held by the draft cache (STANDALONE)
    verify_ct: int = 0
    accepted: int = 0
    proposed: int = 0
    correct_drafts_histogram: list[int] = field(default_factory=list)  # [i] = verifies that accepted i drafts
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    seed: int = 0  # its random stream (sampling.RowSeeds): SGLang's sampling_seed, or one the engine drew
    finished: bool = False

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def cache_len(self) -> int:
        """Positions in the target cache: the prefilled part of the prompt, or everything but the last token."""
        return len(self.tokens) - 1 if self.output_len else self.prefilled
