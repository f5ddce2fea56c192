"""SGLANG_SIMULATE_ACC_LEN on the real engine: a fixed number of tokens per verify, read from the spec histogram."""

from __future__ import annotations

import pytest

from workflow_scripts.engine.types import EngineConfigError, SamplingParams, SpecConfig

from .conftest import prompts, run_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.9, max_new_tokens=20, ignore_eos=True, sampling_seed=7)


def standalone(steps: int, draft) -> SpecConfig:
    return SpecConfig("STANDALONE", steps, 1, steps + 1, draft)


@pytest.mark.parametrize("mode", ["fixed", "real-draft-token"])
@pytest.mark.parametrize("tokens_per_verify", [1, 2, 4])
def test_every_verify_accepts_k_minus_one_drafts(tokens_per_verify, mode, target_dir, dense_draft_dir, engine_factory,
                                                 monkeypatch):
    """SGLang's value counts the bonus token: k tokens a verify = k - 1 accepted drafts, whatever the draft proposed
    (an unrelated draft, mostly rejected for real), for greedy and sampled requests alike."""
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", str(tokens_per_verify))
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_TOKEN_MODE", mode)
    engine = engine_factory(target_dir, standalone(3, dense_draft_dir), 4, 0)
    for params in (GREEDY, SAMPLED):
        _, finals = run_engine(engine, prompts(5), params)
        for f in finals:
            drafts = tokens_per_verify - 1
            assert f.spec_correct_drafts_histogram == (0,) * drafts + (f.spec_verify_ct,)
            assert f.spec_accepted_drafts == drafts * f.spec_verify_ct
    stats = engine.stats()
    assert stats["avg_spec_accept_length"] == tokens_per_verify


def test_a_fraction_keeps_its_mean(target_dir, dense_draft_dir, engine_factory, monkeypatch):
    """match-expected draws floor or ceil per verify batch with the weights that keep the mean (2.5 -> 1 or 2 drafts)."""
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "2.5")
    engine = engine_factory(target_dir, standalone(3, dense_draft_dir), 4, 0)
    _, finals = run_engine(engine, prompts(8, seed=3), SamplingParams(temperature=0.0, max_new_tokens=60, ignore_eos=True))
    histogram = [sum(h) for h in zip(*(f.spec_correct_drafts_histogram + (0,) * 3 for f in finals))]
    assert histogram[0] == 0 and histogram[3:] == [0] * (len(histogram) - 3)
    assert histogram[1] > 0 and histogram[2] > 0
    assert 2.2 < engine.stats()["avg_spec_accept_length"] < 2.8


@pytest.mark.parametrize("steps", [1, 3])
def test_lossless_where_k_is_the_real_acceptance(steps, target_dir, engine_factory, monkeypatch):
    """The target as its own draft has every draft accepted for real: k = steps + 1 forced with the real draft tokens
    gives the plain greedy output token for token."""
    baseline = engine_factory(target_dir, None, 4, 0)
    expected, _ = run_engine(baseline, prompts(5), GREEDY)
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", str(steps + 1))
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_TOKEN_MODE", "real-draft-token")
    engine = engine_factory(target_dir, standalone(steps, target_dir), 4, 0)
    outs, finals = run_engine(engine, prompts(5), GREEDY)
    assert outs == expected
    assert all(f.spec_correct_drafts_histogram[steps] == f.spec_verify_ct for f in finals)


@pytest.mark.parametrize("var, value", [("SGLANG_SIMULATE_ACC_LEN", "three"), ("SGLANG_SIMULATE_ACC_METHOD", "mean"),
                                        ("SGLANG_SIMULATE_ACC_TOKEN_MODE", "draft")])
def test_bad_values_name_the_variable(var, value, target_dir, dense_draft_dir, engine_factory, monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "2")
    monkeypatch.setenv(var, value)
    with pytest.raises(EngineConfigError, match=var):
        engine_factory(target_dir, standalone(2, dense_draft_dir), 2, 0)
