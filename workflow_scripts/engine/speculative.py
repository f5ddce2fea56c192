"""Draft proposers for speculative decoding: a small draft model (STANDALONE) or n-gram lookup (NGRAM).

Both return the same shape of proposal, so the scheduler verifies them with one code path:
(draft tokens [B, K], draft distributions [B, K, V] or None for a point mass, real drafts per row [B]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from workflow_scripts.engine import ngram
from workflow_scripts.engine.model import DecoderModel, Segment
from workflow_scripts.engine.sampling import DRAFT, RowParams, RowSeeds, sample, sampling_probs
from workflow_scripts.engine.sequence import Sequence


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # [B, K] long (padding past num[b] is arbitrary)
    probs: torch.Tensor | None  # [B, K, V], or None: deterministic proposal
    num: torch.Tensor  # [B] long, real drafts per row


class Drafter(Protocol):
    def prefill(self, seqs: list[Sequence], segments: list[Segment]) -> None:
        """Take in prompt chunks the target has just prefilled (the same segments, slots and positions)."""

    def propose(self, seqs: list[Sequence], params: RowParams, k: int, seeds: RowSeeds) -> Proposal: ...
    def move_slot(self, src: int, dst: int, length: int) -> None: ...


def pad_rows(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into [B, T] (pad id 0) and return their lengths [B]."""
    lengths = [len(r) for r in rows]
    width = max(lengths)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), torch.tensor(lengths)


class StandaloneDrafter:
    """Runs the draft model over every running sequence in lock-step batched forwards.

    Each sequence's draft cache holds `seq.draft_len` positions. Before proposing, the draft
    catches up on the committed tokens it has not seen (1 or 2 after a verify, ragged across rows);
    that forward already yields the first draft token, then k-1 single-token forwards follow.
    """

    def __init__(self, model: DecoderModel, slots: int, capacity: int):
        self.model = model
        self.cache = model.new_cache(slots, capacity)

    def prefill(self, seqs: list[Sequence], segments: list[Segment]) -> None:
        self.model.forward_segments(segments, self.cache)
        for s in seqs:
            s.draft_len = s.prefilled

    def propose(self, seqs: list[Sequence], params: RowParams, k: int, seeds: RowSeeds) -> Proposal:
        B = len(seqs)
        tokens, lens = pad_rows([s.tokens[s.draft_len :] for s in seqs])
        start = torch.tensor([s.draft_len for s in seqs])
        hidden = self.model.forward(tokens, start, self.cache)[torch.arange(B), lens - 1]
        greedy = params.all_greedy  # argmax drafts are a point mass: no distributions to keep
        drafts, dists = [], []
        for step in range(k):
            logits = self.model.logits(hidden)
            if greedy:
                tok = logits.argmax(-1)
            else:
                probs = sampling_probs(logits, params)
                tok = sample(probs, seeds.uniform(DRAFT, step))
                dists.append(probs)
            drafts.append(tok)
            start = start + (lens if step == 0 else 1)
            if step + 1 < k:
                hidden = self.model.forward(tok[:, None], start, self.cache)[:, 0]
        for s, n in zip(seqs, start.tolist()):
            s.draft_len = n
        return Proposal(torch.stack(drafts, 1), torch.stack(dists, 1) if dists else None, torch.full((B,), k))

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.move_slot(src, dst, length)


class NgramDrafter:
    """Proposes continuations found earlier in the sequence; rows without a match propose nothing."""

    def prefill(self, seqs: list[Sequence], segments: list[Segment]) -> None:
        pass

    def propose(self, seqs: list[Sequence], params: RowParams, k: int, seeds: RowSeeds) -> Proposal:
        rows = [ngram.propose(s.tokens, k) for s in seqs]
        width = max(len(r) for r in rows)
        tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)
        return Proposal(tokens, None, torch.tensor([len(r) for r in rows]))

    def move_slot(self, src: int, dst: int, length: int) -> None:
        pass
