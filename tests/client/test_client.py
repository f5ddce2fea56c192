"""The workload client against a real embedded server on the smoke pair: both APIs, exactly c requests in
flight, warm-up marking, prompts identical across runs, and a failing request recorded, never dropped."""

from __future__ import annotations

import pytest

from workflow_scripts.client.cell import CellPlan, run_cell, sampling_params, seed_base
from workflow_scripts.client.prompts import Prompt, build_prompts, definition_head, load_tokenizer
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

SYNTHETIC = {"kind": "synthetic", "num_prompts": 6, "input_len": 12, "output_len": 10, "temperature": 0.0,
             "top_p": 1.0, "top_k": -1, "ignore_eos": True, "seed": 3}
REALISTIC = dict(SYNTHETIC, kind="realistic", input_len=24, output_len=24, temperature=0.7, top_p=0.95,
                 ignore_eos=False)
PARAMS = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 10, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(smoke_pair, tmp_path_factory):
    target, draft = smoke_pair
    port = free_port()
    spec = ServerSpec("embedded", str(target), str(draft), "127.0.0.1", 8, 0, num_threads=1)
    setting = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
               "speculative_num_draft_tokens": 3}
    log = tmp_path_factory.mktemp("client") / "server.log"
    with ServerProcess(build_command(spec, setting, port), log, f"http://127.0.0.1:{port}", 120) as srv:
        yield srv


def max_overlap(records) -> int:
    """The most requests open at one instant, from the client's own send/end timestamps."""
    events = sorted([(r.send_ts, 1) for r in records] + [(r.end_ts, -1) for r in records], key=lambda e: (e[0], e[1]))
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


@pytest.mark.parametrize("api", ["generate", "openai", "chat"])
def test_cell_holds_exactly_c_in_flight_and_records_everything(server, smoke_pair, api):
    prompts = build_prompts(SYNTHETIC, smoke_pair[0])
    plan = CellPlan(concurrency=4, warmup=4, measured=8, api=api)
    result = run_cell(server.base_url, plan, prompts, PARAMS, f"t-{api}")
    assert len(result.records) == 12 and all(r.error is None for r in result.records), [r.error for r in result.records]
    assert max_overlap(result.records) == 4
    assert result.warmup_ids == {f"t-{api}-{i}" for i in range(4)}
    for rec in result.records:
        assert rec.output_tokens == 10 and rec.finish_reason == "length"
        assert rec.send_ts < rec.first_token_ts <= rec.end_ts and rec.chunk_ts == sorted(rec.chunk_ts)
    if api == "generate":
        # native API: per-request speculation counters and token ids, chunk token counts add up
        for rec in result.records:
            assert rec.spec_verify_ct and rec.accept_length and rec.accept_length >= 1
            assert sum(rec.chunk_tokens) == 10 and len(rec.output_ids) == 10
            histogram = rec.spec_correct_drafts_histogram
            assert sum(histogram) == rec.spec_verify_ct and len(histogram) <= 3  # steps 2: 0..2 correct drafts
            assert sum(i * n for i, n in enumerate(histogram)) == rec.spec_num_correct_drafts
            assert rec.spec_num_proposed_drafts == 2 * rec.spec_verify_ct
    assert 0 < result.client_cpu_s < result.wall_s


def test_same_prompt_same_greedy_output_on_both_apis(server, smoke_pair):
    prompts = build_prompts(SYNTHETIC, smoke_pair[0])[:2]
    tokenizer = load_tokenizer(smoke_pair[0])
    plan = CellPlan(concurrency=1, warmup=0, measured=2)
    native = run_cell(server.base_url, plan, prompts, PARAMS, "n").records
    openai = run_cell(server.base_url, CellPlan(1, 0, 2, api="openai"), prompts, PARAMS, "o").records
    for a, b in zip(native, openai):
        assert a.prompt_id == b.prompt_id
        assert tokenizer.decode(a.output_ids) == b.text


def test_seeded_t_above_0_cells_repeat_their_text_within_a_round_across_settings_and_apis(server, smoke_pair):
    """Common random numbers: with sampling seeds, two cells of one round (at another concurrency, so other
    batches, as two settings run them) sample the same tokens, and the next round other ones; without seeds, no two
    cells agree. The OpenAI API sends the same seeds as `seed`."""
    workload = dict(REALISTIC, temperature=1.0, top_p=1.0, output_len=24, ignore_eos=True, sampling_seeds=True)
    prompts, params = build_prompts(workload, smoke_pair[0]), sampling_params(workload)
    tokenizer = load_tokenizer(smoke_pair[0])

    def texts(plan: CellPlan, tag: str) -> list[str]:
        records = sorted(run_cell(server.base_url, plan, prompts, params, tag).records, key=lambda r: r.request_id)
        assert all(r.error is None for r in records), [r.error for r in records]
        return [tokenizer.decode(r.output_ids) if r.output_ids else r.text for r in records]

    seeded = texts(CellPlan(4, 0, 6, seed_base=seed_base(workload, 0)), "a")
    assert texts(CellPlan(2, 0, 6, seed_base=seed_base(workload, 0)), "b") == seeded
    assert texts(CellPlan(3, 0, 6, api="openai", seed_base=seed_base(workload, 0)), "c") == seeded
    # the next round draws new streams, the same for every setting of that round
    next_round = texts(CellPlan(4, 0, 6, seed_base=seed_base(workload, 1)), "n")
    assert next_round != seeded and texts(CellPlan(2, 0, 6, seed_base=seed_base(workload, 1)), "m") == next_round
    assert seed_base(dict(workload, sampling_seeds=False), 0) is None
    unseeded = [texts(CellPlan(4, 0, 6), tag) for tag in ("d", "e")]
    assert unseeded[0] != unseeded[1] and unseeded[0] != seeded


def test_chat_sends_the_prompt_text_through_the_chat_template(server, smoke_pair):
    """api chat: the same greedy output as /generate given the chat-templated prompt ids."""
    from transformers import AutoTokenizer

    prompts = build_prompts(REALISTIC, smoke_pair[0])[:2] + build_prompts(SYNTHETIC, smoke_pair[0])[:1]
    chat = run_cell(server.base_url, CellPlan(1, 0, 3, api="chat"), prompts, PARAMS, "c").records
    hf = AutoTokenizer.from_pretrained(smoke_pair[0])
    templated = [Prompt(p.prompt_id, input_ids=hf.apply_chat_template(
        [{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=True, return_dict=True,
    )["input_ids"]) for p in prompts]
    native = run_cell(server.base_url, CellPlan(1, 0, 3), templated, PARAMS, "n").records
    tokenizer = load_tokenizer(smoke_pair[0])
    for a, b, p in zip(native, chat, templated):
        assert b.error is None and b.finish_reason == "length" and b.output_tokens == 10
        assert b.prompt_tokens == len(p.input_ids)
        assert tokenizer.decode(a.output_ids) == b.text


def test_prompts_are_deterministic_and_realistic_ones_are_definition_heads(smoke_pair):
    target = smoke_pair[0]
    assert build_prompts(SYNTHETIC, target) == build_prompts(SYNTHETIC, target)
    realistic = build_prompts(REALISTIC, target)
    assert len(realistic) == 6 and all(p.text and p.input_ids is None for p in realistic)
    tokenizer = load_tokenizer(target)
    assert all(len(tokenizer.encode(p.text, add_special_tokens=False).ids) <= 24 for p in realistic)
    doc = 'def f(x):\n    """Double x."""\n    return 2 * x\n'
    assert definition_head(doc) == 'def f(x):\n    """Double x."""\n'
    assert definition_head("class A:\n    a = 1\n    b = 2\n    c = 3\n") == "class A:\n    a = 1\n    b = 2\n"


def test_a_refused_request_is_recorded_as_an_error_not_dropped(server, smoke_pair):
    prompts = build_prompts(SYNTHETIC, smoke_pair[0])
    bad = dict(PARAMS, max_new_tokens=-1)
    result = run_cell(server.base_url, CellPlan(2, 0, 4), prompts, bad, "bad")
    assert len(result.records) == 4
    assert all(r.error and r.error.startswith("HTTP 400") and "max_new_tokens" in r.error for r in result.records)
