"""The Scheduler end to end on tiny random models: batching, speculation, stopping, aborts, bad input."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from workflow_scripts.engine.scheduler import Scheduler
from workflow_scripts.engine.types import EngineConfigError, SamplingParams, SpecConfig, TokenEvent

from .conftest import VOCAB, Collector, prompts, run_engine, with_config

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)


def spec(algorithm: str, steps: int, draft=None) -> SpecConfig:
    return SpecConfig(algorithm, steps, 1, steps + 1, draft)


@pytest.fixture(scope="module")
def baseline(target_dir):
    """Greedy outputs without speculation, one request at a time."""
    engine = Scheduler(target_dir, None, 1, 0, num_threads=1)
    engine.start()
    try:
        return [run_engine(engine, [p], GREEDY)[0][0] for p in prompts(6)]
    finally:
        engine.stop()


def test_greedy_matches_transformers_generate(target_dir, baseline):
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    for p, out in zip(prompts(2), baseline):
        ref = model.generate(torch.tensor([p]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert out == ref[0, len(p):].tolist()


def test_continuous_batch_equals_one_at_a_time(target_dir, baseline, engine_factory):
    engine = engine_factory(target_dir, None, 4, 0)  # 6 prompts, 4 slots: some wait, then join mid-run
    outs, finals = run_engine(engine, prompts(6), GREEDY)
    assert outs == baseline
    assert all(f.finish_reason == {"type": "length", "length": 24} and f.completion_tokens == 24 for f in finals)


@pytest.mark.parametrize(
    "algorithm, steps, draft",
    [("STANDALONE", 1, "near_draft_dir"), ("STANDALONE", 3, "near_draft_dir"), ("STANDALONE", 2, "dense_draft_dir"),
     ("STANDALONE", 2, "target_dir"), ("NGRAM", 3, None)],
)
def test_greedy_speculation_is_token_identical(algorithm, steps, draft, target_dir, baseline, engine_factory, request):
    draft_dir = request.getfixturevalue(draft) if draft else None
    engine = engine_factory(target_dir, spec(algorithm, steps, draft_dir), 4, 0)
    outs, finals = run_engine(engine, prompts(6), GREEDY)
    assert outs == baseline
    for f in finals:
        assert f.spec_verify_ct >= 1 and f.spec_accepted_drafts <= f.spec_proposed_drafts
        assert f.completion_tokens == 24
    if draft == "target_dir":  # a perfect draft: every proposal accepted
        assert all(f.spec_accepted_drafts == f.spec_proposed_drafts for f in finals)
        assert engine.stats()["avg_spec_accept_length"] > steps
    if draft == "near_draft_dir":  # both accept and reject paths were exercised
        total = sum(f.spec_accepted_drafts for f in finals), sum(f.spec_proposed_drafts for f in finals)
        assert 0 < total[0] < total[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_speculation_completes_with_limits(dtype, target_dir, near_draft_dir, engine_factory):
    engine = engine_factory(target_dir, spec("STANDALONE", 3, near_draft_dir), 3, 7, dtype=dtype)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=10, ignore_eos=True)
    outs, finals = run_engine(engine, prompts(5, seed=3), params)
    assert [len(o) for o in outs] == [10] * 5  # accepted runs are truncated at max_new_tokens
    assert all(0 <= t < VOCAB for o in outs for t in o)


def run_seeded(engine: Scheduler, batch: list[list[int]], seeds: list[int]) -> list[list[int]]:
    """Submit sampled requests, each with its own sampling_seed, all at once; outputs in prompt order."""
    col = Collector()
    rids = [f"s{i}" for i in range(len(batch))]
    for rid, prompt, seed in zip(rids, batch, seeds):
        params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=16, ignore_eos=True, sampling_seed=seed)
        engine.submit(rid, prompt, params, col.sink)
    col.wait(rids)
    return [col.tokens[r] for r in rids]


@pytest.mark.parametrize("speculation", [False, True])
def test_a_seeded_request_samples_the_same_tokens_in_any_batch_on_any_server(
    speculation, target_dir, near_draft_dir, engine_factory
):
    """SGLang's sampling_seed: the A/A twin and every round of a T>0 cell sample the same text."""
    cfg = spec("STANDALONE", 2, near_draft_dir) if speculation else None
    batch, seeds = prompts(5, seed=4), [11, 12, 13, 14, 15]
    batched = run_seeded(engine_factory(target_dir, cfg, 4, 0), batch, seeds)  # 5 requests, 4 slots
    other = engine_factory(target_dir, cfg, 1, 99)  # another server seed, one request at a time
    assert [run_seeded(other, [p], [s])[0] for p, s in zip(batch, seeds)] == batched
    reseeded = run_seeded(other, batch, [s + 100 for s in seeds])
    assert sum(a != b for a, b in zip(reseeded, batched)) >= 4  # it does sample: another seed, other tokens


def test_concurrent_submitters_all_complete(target_dir, near_draft_dir, engine_factory):
    engine = engine_factory(target_dir, spec("STANDALONE", 2, near_draft_dir), 3, 0)
    col = Collector()
    batch = prompts(12, seed=9)
    params = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    threads = [threading.Thread(target=engine.submit, args=(f"c{i}", p, params, col.sink)) for i, p in enumerate(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    col.wait([f"c{i}" for i in range(12)])
    assert all(len(col.tokens[f"c{i}"]) == 8 for i in range(12))
    deadline = time.monotonic() + 10  # the last slot is released just after its final event
    while engine.stats()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["num_running"] == 0 and engine.stats()["num_waiting"] == 0


@pytest.mark.parametrize("speculation", [None, "STANDALONE"])
def test_eos_stops_unless_ignored(speculation, target_dir, near_draft_dir, baseline, tmp_path, engine_factory):
    out = baseline[0]
    j = next(i for i in range(3, len(out)) if out[i] not in out[:i])  # first fresh token after a few steps
    eos_dir = with_config(target_dir, tmp_path / "eos", eos_token_id=out[j])
    cfg = spec("STANDALONE", 3, near_draft_dir) if speculation else None
    engine = engine_factory(eos_dir, cfg, 2, 0)
    assert engine.eos_token_ids == (out[j],)
    stopped, (fin,) = run_engine(engine, prompts(1), SamplingParams(temperature=0.0, max_new_tokens=24))
    assert stopped[0] == out[: j + 1]
    assert fin.finish_reason == {"type": "stop", "matched": out[j]} and fin.completion_tokens == j + 1
    ignored, (fin,) = run_engine(engine, prompts(1), GREEDY)
    assert ignored[0] == out and fin.finish_reason["type"] == "length"
    by_stop_id, (fin,) = run_engine(engine, prompts(1), SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True,
                                                                       stop_token_ids=(out[2],)))
    assert by_stop_id[0] == out[:3] and fin.finish_reason == {"type": "stop", "matched": out[2]}


def test_abort_frees_the_slot(target_dir, engine_factory):
    engine = engine_factory(target_dir, None, 1, 0)
    col = Collector()

    def abort_after_two_tokens(ev):  # deterministic timing: abort from inside the stream
        col.sink(ev)
        if len(col.tokens["long"]) == 2:
            engine.abort("long")

    long = SamplingParams(temperature=0.0, max_new_tokens=400, ignore_eos=True)
    engine.submit("long", prompts(1)[0], long, abort_after_two_tokens)
    engine.submit("queued", prompts(2)[1], SamplingParams(temperature=0.0, max_new_tokens=3), col.sink)
    col.wait(["long", "queued"])
    assert col.final["long"].finish_reason["type"] == "abort"
    assert col.final["long"].new_ids == [] and len(col.tokens["long"]) == 2
    assert col.final["queued"].finish_reason["type"] in ("length", "stop")  # got the freed slot
    engine.abort("long")  # already finished: ignored
    engine.submit("long", prompts(1)[0], SamplingParams(max_new_tokens=2), col.sink)  # the rid may be reused
    col.final.pop("long")
    col.wait(["long"])


def test_abort_while_waiting(target_dir, engine_factory):
    engine = engine_factory(target_dir, None, 1, 0)
    col = Collector()
    gate = threading.Event()

    def slow(ev):  # holds the only slot until the test has aborted the queued request
        col.sink(ev)
        gate.wait(10)

    engine.submit("busy", prompts(1)[0], SamplingParams(temperature=0.0, max_new_tokens=2), slow)
    engine.submit("queued", prompts(2)[1], SamplingParams(max_new_tokens=5), col.sink)
    engine.abort("queued")
    gate.set()
    col.wait(["busy", "queued"])
    assert col.final["queued"].finish_reason["type"] == "abort"
    assert col.tokens["queued"] == []  # never admitted


def test_zero_new_tokens_and_bad_submissions(target_dir, engine_factory):
    engine = engine_factory(target_dir, None, 2, 0, context_length=32)
    outs, (fin,) = run_engine(engine, prompts(1), SamplingParams(max_new_tokens=0))
    assert outs == [[]] and fin.finish_reason == {"type": "length", "length": 0}
    sink = Collector().sink
    for ids, params, field in [
        ([], SamplingParams(), "input_ids"),
        ([1] * 32, SamplingParams(), "input_ids"),
        ([VOCAB], SamplingParams(), "input_ids"),
        ([1, 2], SamplingParams(max_new_tokens=-1), "max_new_tokens"),
        ([1, 2], SamplingParams(top_p=0.0), "sampling_params"),
    ]:
        with pytest.raises(ValueError, match=field):
            engine.submit("bad", ids, params, sink)
    # a request running into the context length ends with finish_reason length
    outs, (fin,) = run_engine(engine, [[1] * 28], SamplingParams(temperature=0.0, max_new_tokens=100, ignore_eos=True))
    assert len(outs[0]) == 4 and fin.finish_reason["type"] == "length"


def test_config_errors_name_the_flag_or_path(target_dir, tmp_path):
    small_vocab = with_config(target_dir, tmp_path / "small", vocab_size=VOCAB - 1)
    cases = [
        (dict(spec=spec("STANDALONE", 2, None)), "--speculative-draft-model-path"),
        (dict(spec=SpecConfig("STANDALONE", 2, 1, 4, target_dir)), "--speculative-num-draft-tokens"),
        (dict(spec=SpecConfig("STANDALONE", 2, 2, 3, target_dir)), "--speculative-eagle-topk"),
        (dict(spec=SpecConfig("EAGLE9", 2, 1, 3, None)), "--speculative-algorithm"),
        (dict(spec=spec("NGRAM", 2, target_dir)), "--speculative-draft-model-path"),
        (dict(spec=None, max_running_requests=0), "--max-running-requests"),
        (dict(spec=None, context_length=10**6), "--context-length"),
        (dict(spec=None, dtype="float16"), "--dtype"),
    ]
    for kwargs, flag in cases:
        kwargs.setdefault("max_running_requests", 2)
        with pytest.raises(EngineConfigError, match=flag):
            Scheduler(target_dir, random_seed=0, **kwargs)
    with pytest.raises(EngineConfigError, match="vocab_size") as info:
        Scheduler(target_dir, spec("STANDALONE", 2, small_vocab), 2, 0)
    assert str(small_vocab) in str(info.value)


def test_a_failing_sink_does_not_stop_the_others(target_dir, engine_factory):
    engine = engine_factory(target_dir, None, 2, 0)
    col = Collector()

    def broken(ev):
        raise RuntimeError("client went away badly")

    params = SamplingParams(temperature=0.0, max_new_tokens=5, ignore_eos=True)
    engine.submit("broken", prompts(1)[0], params, broken)
    engine.submit("fine", prompts(2)[1], params, col.sink)
    col.wait(["fine"])
    assert len(col.tokens["fine"]) == 5
    deadline = time.monotonic() + 10  # the broken request still runs to its end and frees its slot
    while engine.stats()["num_finished"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["num_finished"] == 2


class BatchCollector(Collector):
    """A sink with a `batch` method, as the engine process's: records each call's events."""

    def __init__(self):
        super().__init__()
        self.calls: list[list[TokenEvent]] = []

    def __call__(self, ev: TokenEvent) -> None:
        self.sink(ev)

    def batch(self, events: list[TokenEvent]) -> None:
        self.calls.append(list(events))
        for ev in events:
            self.sink(ev)


@pytest.mark.parametrize("speculation", [False, True])
def test_a_batch_sink_gets_one_call_per_forward_with_every_running_request(
    speculation, target_dir, near_draft_dir, engine_factory
):
    """SGLang's BatchTokenIDOut: the engine process sends one message per forward, not one per request, and each
    request's events keep their order and carry the same tokens as one-event-at-a-time sinks get."""
    cfg = spec("STANDALONE", 2, near_draft_dir) if speculation else None
    batch = prompts(4, seed=6)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    engine = engine_factory(target_dir, cfg, 4, 0)
    col = BatchCollector()
    rids = [f"b{i}" for i in range(len(batch))]
    for rid, prompt in zip(rids, batch):
        engine.submit(rid, prompt, params, col)
    col.wait(rids)
    assert [col.tokens[r] for r in rids] == run_engine(engine, batch, params)[0]  # per-event sinks, same tokens
    for call in col.calls:
        assert len({ev.rid for ev in call}) == len(call)  # one event per request and forward
    assert max(len(call) for call in col.calls) == len(batch)  # decode forwards of all four: one call
    assert sum(len(call) for call in col.calls) == sum(len(col.events[r]) for r in rids)
    for rid in rids:  # in order: completion counts rise, the final event last
        counts = [ev.completion_tokens for ev in col.events[rid]]
        assert counts == sorted(counts) and col.events[rid][-1].finished and counts[-1] == 12
