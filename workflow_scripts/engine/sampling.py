"""Turning logits into token choices: per-row temperature/top-k/top-p, and speculative acceptance.

One `sampling_probs` is used for both the target and the draft distribution, so that top-k/top-p
are applied the same way to both: that is what makes rejection sampling lossless with them.
Temperature 0 becomes a one-hot distribution at the argmax, so greedy acceptance is the same
rule as speculative sampling (accept iff the draft token is the argmax; otherwise emit the argmax).

Randomness comes from `RowSeeds`, never from a generator shared by the batch: a uniform depends only on the
request's seed (SGLang's `sampling_seed`), the output position it decides and what it is for. A request's tokens
then do not depend on which other requests shared its batches, so two servers given the same seeds sample the same
text (common random numbers: an A/A pair at T>0 differs only in timing), and a rerun samples what the first did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# what a uniform decides: each purpose has its own stream, so no (seed, position) reuses one
TARGET, DRAFT, ACCEPT = 0, 1, 2
_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x in int64, in halves so that no product overflows int64."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: every input bit reaches every output bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


@dataclass(frozen=True)
class RowSeeds:
    """Each row's random stream, keyed by its request seed and output position (a counter-based generator, as
    SGLang's `multinomial_with_seed` keys its noise by seed and position)."""

    seed: torch.Tensor  # [B] int64 in [0, 2**63)
    position: torch.Tensor  # [B] int64: the output index of the row's next token

    def uniform(self, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        """One float64 uniform in [0, 1) per row, for the token at output index position + offset."""
        return self._draw(self.seed, self.position + offset, purpose)

    def uniform_grid(self, purpose: int, k: int) -> torch.Tensor:
        """[B, k] uniforms for the tokens at output indices position .. position + k - 1."""
        pos = self.position[:, None] + torch.arange(k)[None, :]
        return self._draw(self.seed[:, None].expand_as(pos), pos, purpose)

    @staticmethod
    def _draw(seed: torch.Tensor, pos: torch.Tensor, purpose: int) -> torch.Tensor:
        key = _fmix32((pos * 4 + purpose) & _M32)
        key = _fmix32(key ^ (seed & _M32))
        key = _fmix32(key ^ (seed >> 32))
        hi, lo = _fmix32(key ^ 0x9E3779B9), _fmix32(key ^ 0x7F4A7C15)
        return (hi * (1 << 21) + (lo >> 11)).double() / float(1 << 53)


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


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token id per row of probs [N, V] (rows need not be normalised), given one uniform [N] per row.

    Inverse CDF: several times cheaper than torch.multinomial on CPU.
    The clamp keeps a u that rounds up to the total on the last token with non-zero mass.
    """
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = uniform.to(cdf.dtype)[:, None] * total
    idx = torch.searchsorted(cdf, u, right=True)
    last = (cdf < total).sum(-1, keepdim=True)
    return torch.minimum(idx, last).squeeze(-1)


def choose_tokens(logits: torch.Tensor, params: RowParams, seeds: RowSeeds) -> torch.Tensor:
    """Next token per row of logits [N, V]; an all-greedy batch skips softmax and the RNG (the common T=0 case)."""
    if params.all_greedy:
        return logits.argmax(-1)
    return sample(sampling_probs(logits, params), seeds.uniform(TARGET))


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
    seeds: RowSeeds,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling for a batch (Leviathan et al. / Chen et al.).

    target_probs [B, K+1, V]: target distributions at the K draft positions and the bonus position.
    draft_tokens [B, K]; draft_probs [B, K, V] the distributions they were drawn from, or None for a
    deterministic proposal (n-gram): a point mass at the token. num_drafts [B]: how many of the K
    drafts are real in each row (the rest is padding and never accepted).
    Returns (accepted [B]: leading drafts accepted, next_token [B]: the corrected or bonus token).
    The corrected or bonus token draws from the TARGET stream at its position, as a plain decode step would.
    """
    B, K = draft_tokens.shape
    if draft_probs is None:
        draft_probs = torch.zeros_like(target_probs[:, :K]).scatter_(-1, draft_tokens[..., None], 1.0)
    p_tok = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_tok = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = seeds.uniform_grid(ACCEPT, K).to(q_tok.dtype)
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
    return accepted, sample(residual, seeds.uniform(TARGET, accepted))
