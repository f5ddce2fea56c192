"""The engine process's in-engine bench answers every cell over its ZMQ socket, whatever the cell does: the front
awaits that answer, so a cell that raised without one would hold /in_engine_bench for its whole timeout_s."""

from __future__ import annotations

import time

import pytest
import zmq

from workflow_scripts.engine.engine_process import EventSink, closed_loop_cell
from workflow_scripts.engine.types import SamplingParams

from .conftest import prompts

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
TIMEOUT_S = 30.0


@pytest.fixture
def front(tmp_path):
    """The front's end: a PULL socket bound where the engine process's EventSink connects."""
    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/outputs"
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    sink = EventSink(ctx, address)
    yield pull, sink
    sink.close()
    pull.close(linger=0)
    ctx.term()


def answer(pull: zmq.Socket, token: int) -> tuple[dict, float]:
    """The cell's reply and how long it took to come."""
    tic = time.monotonic()
    assert pull.poll(int(TIMEOUT_S * 1000)), "no reply from the cell"
    kind, got, body = pull.recv_pyobj()
    assert (kind, got) == ("closed_loop", token)
    return body, time.monotonic() - tic


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # an engine refusal: the message starts with the field, and the front answers 400 naming it
        (SamplingParams(temperature=-1.0, max_new_tokens=4), {"timed_out": False}),
        # not a SamplingParams: an AttributeError, a fault of ours that the front answers 500 with
        (None, {"internal": True}),
    ],
)
def test_a_failing_cell_is_answered_at_once(target_dir, engine_factory, front, params, expected):
    pull, sink = front
    engine = engine_factory(target_dir, None, 2, 0)
    closed_loop_cell(engine, 7, prompts(3), [params] * 3, 2, TIMEOUT_S, sink)
    body, waited = answer(pull, 7)
    assert body.items() >= expected.items(), body
    assert body["error"] and waited < TIMEOUT_S / 2
    if params is None:
        assert "AttributeError" in body["error"]
    else:
        assert body["error"].startswith("sampling_params:")


def test_a_cell_answers_each_request_s_tokens(target_dir, engine_factory, front):
    pull, sink = front
    engine = engine_factory(target_dir, None, 2, 0)
    closed_loop_cell(engine, 3, prompts(3), [GREEDY] * 3, 2, TIMEOUT_S, sink)
    body, _ = answer(pull, 3)
    assert [len(r["output_ids"]) for r in body["requests"]] == [GREEDY.max_new_tokens] * 3
    generated = body["engine_after"]["total_generated_tokens"] - body["engine_before"]["total_generated_tokens"]
    assert generated == 3 * GREEDY.max_new_tokens
