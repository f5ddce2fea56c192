"""Turning logits into token choices: per-row temperature/top-k/top-p, and speculative acceptance.

One `sampling_probs` is used for both the target and the draft distribution, so that top-k/top-p
are applied the same way to both: that is what makes rejection sampling lossless with them.
Temperature 0 becomes a one-hot distribution at the argmax, so greedy acceptance is the same
rule as speculative sampling (accept iff the draft token is the argmax; otherwise emit the argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of a batch, one entry per row, as tensors."""

    temperature: torch.Tensor  # [B] float, 0 => greedy
    top_p: torch.Tensor  # [B] float in (0, 1]
    top_k: torch.Tensor  # [B] long, <= 0 => off

    @property
    def all_greedy(self) -> bool:
        return bool((self.temperature <= 0).all())

    @property
    def needs_filter(self) -> bool:
        return bool((self.top_p < 1.0).any() or (self.top_k > 0).any())

    def repeat(self, n: int) -> "RowParams":
        """The same parameters for n consecutive positions per row (flattened [B*n])."""
        return RowParams(*(t.repeat_interleave(n) for t in (self.temperature, self.top_p, self.top_k)))


def sampling_probs(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """Probabilities [N, V] to sample from, for fp32 logits [N, V] and one param row per logits row.

    top-p is cut on the full softmax and top-k on the rank, both before renormalising (SGLang's order).
    """
    greedy = params.temperature <= 0
    if params.all_greedy:  # the common T=0 batch: no softmax needed
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    temp = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    if params.needs_filter:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1])[None, :]
        k = torch.where(params.top_k > 0, params.top_k, probs.shape[-1])
        drop = (ranks >= k[:, None]) | (sorted_p.cumsum(-1) - sorted_p > params.top_p[:, None])
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    if greedy.any():
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], onehot, probs)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of probs [N, V] (rows need not be normalised).

    Inverse CDF with one uniform per row: several times cheaper than torch.multinomial on CPU.
    The clamp keeps a u that rounds up to the total on the last token with non-zero mass.
    """
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, dtype=cdf.dtype) * total
    idx = torch.searchsorted(cdf, u, right=True)
    last = (cdf < total).sum(-1, keepdim=True)
    return torch.minimum(idx, last).squeeze(-1)


def choose_tokens(logits: torch.Tensor, params: RowParams, generator: torch.Generator) -> torch.Tensor:
    """Next token per row of logits [N, V]; an all-greedy batch skips softmax and the RNG (the common T=0 case)."""
    if params.all_greedy:
        return logits.argmax(-1)
    return sample(sampling_probs(logits, params), generator)


def greedy_accept(target_argmax: torch.Tensor, draft_tokens: torch.Tensor, num_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`speculative_accept` for an all-greedy batch, from the target's argmax [B, K+1] alone.

    With one-hot target distributions, rejection sampling accepts a draft iff it is the argmax and
    then emits the argmax: the same tokens, without building [B, K+1, V] distributions.
    """
    B, K = draft_tokens.shape
    ok = (draft_tokens == target_argmax[:, :K]) & (torch.arange(K)[None, :] < num_drafts[:, None])
    accepted = ok.int().cumprod(dim=1).sum(dim=1)
    return accepted, target_argmax[torch.arange(B), accepted]


def speculative_accept(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_drafts: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling for a batch (Leviathan et al. / Chen et al.).

    target_probs [B, K+1, V]: target distributions at the K draft positions and the bonus position.
    draft_tokens [B, K]; draft_probs [B, K, V] the distributions they were drawn from, or None for a
    deterministic proposal (n-gram): a point mass at the token. num_drafts [B]: how many of the K
    drafts are real in each row (the rest is padding and never accepted).
    Returns (accepted [B]: leading drafts accepted, next_token [B]: the corrected or bonus token).
    """
    B, K = draft_tokens.shape
    if draft_probs is None:
        draft_probs = torch.zeros_like(target_probs[:, :K]).scatter_(-1, draft_tokens[..., None], 1.0)
    p_tok = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_tok = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = torch.rand((B, K), generator=generator)
    ok = (u * q_tok < p_tok) & (torch.arange(K)[None, :] < num_drafts[:, None])
    accepted = ok.int().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(B)
    p_next = target_probs[rows, accepted]
    rejected = (accepted < num_drafts)[:, None]
    q_next = draft_probs[rows, accepted.clamp(max=K - 1)] if K else torch.zeros_like(p_next)
    residual = torch.where(rejected, (p_next - q_next).clamp(min=0.0), p_next)
    mass = residual.sum(-1, keepdim=True)
    # p == q at a rejected position has probability 0; fall back to p if float rounding gets there.
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    return accepted, sample(residual, generator)
