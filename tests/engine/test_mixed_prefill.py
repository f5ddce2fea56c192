"""Chunked and mixed prefill on the smoke pair: token-identical at T=0 to the no-speculation baseline.

More requests than slots, with different prompt and output lengths, so prompts are chunked while other
sequences run, refills happen mid-run, and a partly prefilled prompt changes slot when a running one ends.
"""

from __future__ import annotations

import pytest

from workflow_scripts.client.prompts import definition_head, heldout_documents, load_tokenizer
from workflow_scripts.engine.scheduler import Scheduler
from workflow_scripts.engine.types import EngineConfigError, SamplingParams, SpecConfig

from .conftest import Collector

SLOTS = 3
CHUNK = 7  # smaller than most prompts: every long prompt is prefilled over several forwards


@pytest.fixture(scope="module")
def workload(smoke_pair) -> list[tuple[list[int], SamplingParams]]:
    """Real prompts (held-out definition heads) of 10-60 tokens, each with its own output length."""
    target, _ = smoke_pair
    tok = load_tokenizer(target)
    docs = heldout_documents(target)
    heads = [tok.encode(definition_head(d), add_special_tokens=False).ids for d in docs]
    heads = [h[:60] for h in heads if len(h) >= 10][:8]
    assert len(heads) == 8 and len({len(h) for h in heads}) > 2, "smoke held-out set too small for this test"
    return [(h, SamplingParams(temperature=0.0, max_new_tokens=5 + 4 * (i % 4), ignore_eos=True)) for i, h in enumerate(heads)]


def run(engine: Scheduler, workload) -> list[list[int]]:
    col = Collector()
    rids = [f"w{i}" for i in range(len(workload))]
    for rid, (prompt, params) in zip(rids, workload):
        engine.submit(rid, prompt, params, col.sink)
    col.wait(rids)
    assert all(col.final[r].finish_reason["type"] == "length" for r in rids)
    return [col.tokens[r] for r in rids]


@pytest.fixture(scope="module")
def baseline(smoke_pair, workload) -> list[list[int]]:
    """No speculation, no chunking, no mixing, one request at a time."""
    engine = Scheduler(smoke_pair[0], None, 1, 0, num_threads=1, chunked_prefill_size=-1)
    engine.start()
    try:
        return run(engine, workload)
    finally:
        engine.stop()


def spec_for(name: str, draft) -> SpecConfig | None:
    if name == "none":
        return None
    steps = 3 if name == "NGRAM" else 2
    return SpecConfig(name, steps, 1, steps + 1, draft if name == "STANDALONE" else None)


@pytest.mark.parametrize("mixed", [False, True], ids=["separate", "mixed"])
@pytest.mark.parametrize("algorithm", ["none", "STANDALONE", "NGRAM"])
def test_chunked_prefill_is_lossless(algorithm, mixed, smoke_pair, workload, baseline, engine_factory):
    target, draft = smoke_pair
    engine = engine_factory(target, spec_for(algorithm, draft), SLOTS, 0, chunked_prefill_size=CHUNK,
                            enable_mixed_chunk=mixed)
    forwards = []  # the target's forwards, counted here, apart from the engine's own bookkeeping
    target_forward = engine.target.forward_segments
    engine.target.forward_segments = lambda *a, **kw: forwards.append(1) or target_forward(*a, **kw)
    assert run(engine, workload) == baseline
    stats = engine.stats()
    # every prompt token prefilled exactly once, in chunks of at most CHUNK (no padding, no re-prefill)
    assert stats["total_prefill_tokens"] == sum(len(p) for p, _ in workload)
    assert (stats["total_mixed_forwards"] > 0) == mixed
    assert (stats["total_stall_forwards"] == 0) == mixed  # mixing: no prefill forward makes running ones wait
    # each forward counted once, under one mode
    assert sum(stats[f"total_{mode}_forwards"] for mode in ("decode", "extend", "mixed")) == len(forwards)
    # the forward time by mode: decode and prefill-only forwards in both (mixing starts from an idle engine), mixed
    # ones only when mixing
    assert stats["total_decode_seconds"] > 0 and stats["total_extend_seconds"] > 0
    assert (stats["total_mixed_seconds"] > 0) == mixed


@pytest.mark.parametrize("algorithm", ["none", "STANDALONE"])
def test_mixed_whole_prompts_are_lossless(algorithm, smoke_pair, workload, baseline, engine_factory):
    """The default chunk size holds every prompt whole: mixing alone, without splitting."""
    target, draft = smoke_pair
    engine = engine_factory(target, spec_for(algorithm, draft), SLOTS, 0, enable_mixed_chunk=True)
    assert run(engine, workload) == baseline
    assert engine.stats()["total_mixed_forwards"] > 0


def test_mixed_sampling_completes(smoke_pair, workload, engine_factory):
    target, draft = smoke_pair
    engine = engine_factory(target, spec_for("STANDALONE", draft), SLOTS, 5, chunked_prefill_size=CHUNK,
                            enable_mixed_chunk=True)
    sampled = [(p, SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=params.max_new_tokens, ignore_eos=True))
               for p, params in workload]
    outs = run(engine, sampled)
    assert [len(o) for o in outs] == [params.max_new_tokens for _, params in workload]


def test_abort_during_chunked_prefill_frees_the_slot(smoke_pair, workload, baseline, engine_factory):
    """A prompt aborted between two of its chunks ends with one abort event; the next request gets its slot."""
    engine = engine_factory(smoke_pair[0], None, 2, 0, chunked_prefill_size=2, enable_mixed_chunk=True)
    col = Collector()
    (short, short_params), (long_prompt, _), (queued, queued_params) = workload[0], workload[1], workload[2]
    assert len(long_prompt) > 6

    def abort_long_on_second_token(ev):  # the long prompt is still being chunked 2 tokens per forward
        col.sink(ev)
        if len(col.tokens["short"]) == 2:
            engine.abort("long")

    engine.submit("short", short, short_params, abort_long_on_second_token)
    engine.submit("long", long_prompt, SamplingParams(temperature=0.0, max_new_tokens=50), col.sink)
    engine.submit("queued", queued, queued_params, col.sink)
    col.wait(["short", "long", "queued"])
    assert col.final["long"].finish_reason["type"] == "abort" and col.tokens["long"] == []
    assert col.tokens["short"] == baseline[0] and col.tokens["queued"] == baseline[2]


def test_mixed_chunk_needs_chunking_and_bad_sizes_name_the_flag(smoke_pair):
    engine = Scheduler(smoke_pair[0], None, 2, 0, chunked_prefill_size=-1, enable_mixed_chunk=True)
    assert not engine.enable_mixed_chunk  # SGLang: mixing needs chunked prefill
    for size in (0, -2):
        with pytest.raises(EngineConfigError, match="--chunked-prefill-size"):
            Scheduler(smoke_pair[0], None, 2, 0, chunked_prefill_size=size)
