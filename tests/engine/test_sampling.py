"""The speculative sampler must reproduce the target distribution exactly (statistically tested)."""

from __future__ import annotations

import pytest
import torch

from workflow_scripts.engine.sampling import (
    ACCEPT, DRAFT, TARGET, RowParams, RowSeeds, greedy_accept, sample, sampling_probs, speculative_accept,
)  # fmt: skip

V, K, N = 6, 2, 60_000
TV_BOUND = 0.015  # sampling noise here is ~0.005; a wrong sampler is off by >= 0.1 (checked below)


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def params(n: int, temperature: float, top_p: float = 1.0, top_k: int = -1) -> RowParams:
    return RowParams(torch.full((n,), temperature), torch.full((n,), top_p), torch.full((n,), top_k, dtype=torch.long))


def streams(n: int, first_seed: int = 0) -> RowSeeds:
    """n requests with seeds first_seed.. at output position 0."""
    return RowSeeds(torch.arange(first_seed, first_seed + n, dtype=torch.long), torch.zeros(n, dtype=torch.long))


def setup(temperature, top_p, top_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(K + 1, V, generator=g) * 1.5
    draft_logits = torch.randn(K, V, generator=g) * 1.5
    p = sampling_probs(target_logits, params(K + 1, temperature, top_p, top_k))
    q = sampling_probs(draft_logits, params(K, temperature, top_p, top_k))
    return p, q, g


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, -1), (0.7, 0.9, 4), (1.3, 0.8, -1)])
def test_standalone_output_distribution_equals_target(temperature, top_p, top_k):
    p, q, _ = setup(temperature, top_p, top_k)
    assert tv(q[0], p[0]) > 0.1  # the draft really differs, so equality is not for free
    s = streams(N)
    drafts = torch.stack([sample(q[i].expand(N, V), s.uniform(DRAFT, i)) for i in range(K)], 1)
    accepted, nxt = speculative_accept(p.expand(N, K + 1, V), drafts, q.expand(N, K, V), torch.full((N,), K), s)
    first = torch.where(accepted >= 1, drafts[:, 0], nxt)
    assert tv(torch.bincount(first, minlength=V).float(), p[0]) < TV_BOUND
    # given the first draft was accepted, the second token must follow p[1]
    sel = accepted >= 1
    second = torch.where(accepted[sel] >= 2, drafts[sel, 1], nxt[sel])
    assert tv(torch.bincount(second, minlength=V).float(), p[1]) < TV_BOUND
    # filtered-out tokens never appear
    assert set(first[p[0][first] == 0].tolist()) == set()
    # and the test has teeth: emitting the draft token unconditionally would fail it
    assert tv(torch.bincount(drafts[:, 0], minlength=V).float(), p[0]) > TV_BOUND * 4


def test_point_mass_proposal_is_lossless():
    """NGRAM: a deterministic proposal (q = point mass) keeps the target distribution."""
    p, _, _ = setup(0.8, 1.0, -1, seed=3)
    drafts = torch.tensor([[int(p[0].argmin()), 2]]).expand(N, K)
    accepted, nxt = speculative_accept(p.expand(N, K + 1, V), drafts, None, torch.full((N,), K), streams(N, 7 * N))
    first = torch.where(accepted >= 1, drafts[:, 0], nxt)
    assert tv(torch.bincount(first, minlength=V).float(), p[0]) < TV_BOUND


def test_greedy_accepts_exactly_the_argmax_prefix():
    target = torch.zeros(2, 3, V)
    target[:, 0, 1] = target[:, 1, 4] = target[:, 2, 5] = 1.0  # one-hot: greedy target
    drafts = torch.tensor([[1, 4], [1, 3]])
    q = torch.nn.functional.one_hot(drafts, V).float()
    accepted, nxt = speculative_accept(target, drafts, q, torch.tensor([2, 2]), streams(2))
    assert accepted.tolist() == [2, 1] and nxt.tolist() == [5, 4]
    accepted, nxt = speculative_accept(target, drafts, q, torch.tensor([1, 0]), streams(2))  # padded drafts never count
    assert accepted.tolist() == [1, 0] and nxt.tolist() == [4, 1]


def test_greedy_fast_path_equals_one_hot_rejection_sampling():
    """The all-greedy shortcut must pick what speculative_accept picks on one-hot distributions."""
    g = torch.Generator().manual_seed(1)
    B = 200
    logits = torch.randn(B, K + 1, V, generator=g)
    argmax = logits.argmax(-1)
    drafts = torch.where(torch.rand(B, K, generator=g) < 0.6, argmax[:, :K], torch.randint(0, V, (B, K), generator=g))
    num = torch.randint(0, K + 1, (B,), generator=g)
    one_hot = torch.nn.functional.one_hot(argmax, V).float()
    want = speculative_accept(one_hot, drafts, None, num, streams(B))
    got = greedy_accept(argmax, drafts, num)
    assert set(want[0].tolist()) == set(range(K + 1))  # every acceptance count occurs
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sampling_probs_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0], [0.0, 5.0, 1.0, 0.0]])
    probs = sampling_probs(logits, RowParams(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.7, 1.0]),
                                             torch.tensor([2, -1, -1])))
    assert probs[0, 2:].sum() == 0 and probs[0, :2].sum() == pytest.approx(1.0)  # top-k 2
    full = torch.softmax(logits[1], -1)
    assert full[0] < 0.7 < full[0] + full[1]
    assert (probs[1] > 0).tolist() == [True, True, False, False]  # top-p keeps the smallest set reaching 0.7
    assert probs[2].tolist() == [0.0, 1.0, 0.0, 0.0]  # temperature 0 -> argmax


def test_sample_follows_unnormalised_rows_and_skips_zeros():
    weights = torch.tensor([0.0, 0.6, 0.0, 2.4, 1.0, 0.0])  # sums to 4, zeros at both ends and inside
    draws = sample(weights.expand(N, V), streams(N, 3 * N).uniform(TARGET))
    counts = torch.bincount(draws, minlength=V).float()
    assert counts[weights == 0].sum() == 0
    assert tv(counts, weights / weights.sum()) < TV_BOUND


def test_row_streams_are_uniform_and_independent_across_seeds_positions_and_purposes():
    s = streams(N)
    u = s.uniform(TARGET)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    expected = N / 20
    assert float(((counts - expected) ** 2 / expected).sum()) < 45  # chi-square, 19 dof: p ~ 0.001
    grid = s.uniform_grid(ACCEPT, 3)
    others = [s.uniform(DRAFT), s.uniform(TARGET, 1), grid[:, 0], grid[:, 1], streams(N, N).uniform(TARGET)]
    for other in others:  # a different purpose, position or seed gives an uncorrelated stream
        assert abs(float(torch.corrcoef(torch.stack([u, other]))[0, 1])) < 0.03
    assert torch.equal(grid[:, 1], s.uniform(ACCEPT, 1))  # a grid column is the stream at that position


def test_a_row_draws_the_same_uniform_whatever_batch_it_is_in():
    """What makes seeded requests batch-invariant: row r's uniform depends on its seed and position only."""
    alone = RowSeeds(torch.tensor([12345]), torch.tensor([9])).uniform(TARGET)
    batch = RowSeeds(torch.tensor([7, 12345, (1 << 63) - 1]), torch.tensor([0, 9, 4])).uniform(TARGET)
    assert float(batch[1]) == float(alone[0])
    assert len(set(batch.tolist())) == 3
