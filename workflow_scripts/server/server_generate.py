"""Run one validated request through the engine and yield SGLang-shaped outputs, without blocking the event loop.

The engine runs in its own process; `EngineClient` puts each of a request's TokenEvents on an asyncio.Queue.
Events that piled up while the loop was busy are merged into one output, as SGLang's
tokenizer manager merges scheduler batches. Whatever ends the consumer (finish, stop string, disconnect,
cancellation) aborts the engine request in `finally`, so a slot is never leaked.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from workflow_scripts.engine.types import SamplingParams, TokenEvent
from workflow_scripts.server.engine_client import EngineClient
from workflow_scripts.server.http_errors import RequestError
from workflow_scripts.server.metrics import ServerMetrics
from workflow_scripts.server.server_text import OutputText

log = logging.getLogger(__name__)

# How often a running request checks whether its client went away (a streaming one also learns it on send).
DISCONNECT_POLL_S = 0.5


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed validation: token ids and engine parameters, plus the server-side text options."""

    input_ids: list[int]
    params: SamplingParams
    stop_strs: tuple[str, ...] = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    stream_interval: int | None = None  # None: the server's --stream-interval
    log_metrics: bool = True  # False for the health check's probe, as in SGLang
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)


async def _never_disconnected() -> bool:
    return False


class _ClientWatch:
    """Asks whether the client is gone at most every DISCONNECT_POLL_S: tokens may flow the whole time."""

    def __init__(self, is_disconnected: Callable[[], Awaitable[bool]]):
        self._ask = is_disconnected
        self._next_check = time.monotonic() + DISCONNECT_POLL_S

    async def gone(self) -> bool:
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + DISCONNECT_POLL_S
        return await self._ask()


class Generator:
    """Bridges the thread-based engine to asyncio and builds SGLang's `{text, output_ids, meta_info}` outputs."""

    def __init__(
        self,
        engine: EngineClient,
        decode: Callable[[list[int], bool], str],
        speculating: bool,
        stream_interval: int = 1,
        metrics: ServerMetrics | None = None,
        num_draft_tokens: int = 0,  # --speculative-num-draft-tokens; the engine lives in another process
    ):
        self.engine = engine
        self.decode = decode
        self.speculating = speculating
        self.num_draft_tokens = num_draft_tokens
        self.stream_interval = stream_interval
        self.metrics = metrics
        self._in_flight: set[str] = set()

    @property
    def last_event_time(self) -> float:
        """time.monotonic() of the engine's latest event for any request."""
        return self.engine.last_event_time

    def _submit(self, req: PreparedRequest) -> tuple[asyncio.Queue, str]:
        """Submit to the engine under a fresh engine id: the engine drops an aborted request only at its next
        step, so a client that reuses its rid at once must not collide with it. Returns (queue, engine id)."""
        if req.rid in self._in_flight:
            raise RequestError("rid", f"{req.rid!r} is already in flight")
        engine_rid = f"{req.rid}#{uuid.uuid4().hex[:12]}"
        queue = self.engine.submit(engine_rid, req.input_ids, req.params)
        self._in_flight.add(req.rid)
        return queue, engine_rid

    async def _next_events(self, queue: asyncio.Queue, client: _ClientWatch) -> list[TokenEvent] | None:
        """The events queued so far (at least one), or None once the client has gone.

        Raises what the engine client queued instead of an event (EngineRefused, EngineDied)."""
        while True:
            try:
                first = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                break
            except TimeoutError:
                if await client.gone():
                    return None
        events = [first]
        while not queue.empty():
            events.append(queue.get_nowait())
        for item in events:
            if isinstance(item, BaseException):
                raise item
        return None if await client.gone() else events

    def _meta_info(
        self, req: PreparedRequest, out: OutputText, last: TokenEvent, finish_reason: dict | None, t0: float
    ) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": finish_reason,
            "prompt_tokens": len(req.input_ids),
            "weight_version": "default",
            "completion_tokens": len(out.output_ids),
            "cached_tokens": 0,
        }
        if finish_reason is None:
            return meta
        meta["e2e_latency"] = time.perf_counter() - t0
        if self.speculating and last.spec_verify_ct > 0:
            # SGLang's fill_spec_decoding_meta: proposed = verify forwards x (num_draft_tokens - 1), whatever the
            # drafter found (an NGRAM miss still fills its verify width); correct drafts leave the bonus token out.
            verify = last.spec_verify_ct
            proposed = verify * (self.num_draft_tokens - 1)
            correct = last.spec_accepted_drafts
            meta.update(
                spec_verify_ct=verify,
                spec_accept_length=last.completion_tokens / verify,
                spec_accept_rate=correct / proposed if proposed else 0.0,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=proposed,
                spec_correct_drafts_histogram=list(last.spec_correct_drafts_histogram),
                # SGLang 0.5.23's backward-compat aliases of the same values.
                spec_accepted_drafts=correct,
                spec_proposed_drafts=proposed,
                spec_accept_histogram=list(last.spec_correct_drafts_histogram),
            )
        return meta

    async def outputs(
        self,
        req: PreparedRequest,
        is_disconnected: Callable[[], Awaitable[bool]] = _never_disconnected,
        incremental: bool = False,
    ) -> AsyncIterator[dict]:
        """Outputs of one request, the last one with a finish_reason: cumulative `text` and `output_ids` (SGLang's
        default), or with `incremental` only what is new since the previous output (--incremental-streaming-output).

        One output every `stream_interval` new tokens, and the last. Yields nothing more if the client disconnects;
        the engine request is aborted either way.
        """
        t0 = time.perf_counter()
        out = OutputText(lambda ids: self.decode(ids, req.skip_special_tokens), req.stop_strs, req.no_stop_trim)
        interval = req.stream_interval or self.stream_interval
        queue, engine_rid = self._submit(req)
        client = _ClientWatch(is_disconnected)
        metrics = self.metrics if req.log_metrics else None
        finished = failed = False
        finish_reason = None
        sent_ids = sent_chars = 0
        try:
            while not finished:
                try:
                    events = await self._next_events(queue, client)
                except (ValueError, RuntimeError):  # refused by, or lost with, the engine: nothing to abort
                    finished = failed = True
                    raise
                if events is None:
                    return
                if metrics is not None and not out.output_ids and any(e.new_ids for e in events):
                    metrics.first_token(time.perf_counter() - t0)
                finish_reason = None
                for event in events:
                    matched = out.extend(event.new_ids)
                    if matched is not None:
                        finish_reason = {"type": "stop", "matched": matched}
                        break
                    if event.finished:
                        finish_reason = event.finish_reason
                        break
                finished = finish_reason is not None
                if not finished and len(out.output_ids) - sent_ids < interval:
                    continue
                text = out.text(finished)
                if incremental:
                    output = {"text": text[sent_chars:], "output_ids": out.output_ids[sent_ids:]}
                else:
                    output = {"text": text, "output_ids": list(out.output_ids)}
                sent_ids, sent_chars = len(out.output_ids), len(text)
                yield {**output, "meta_info": self._meta_info(req, out, event, finish_reason, t0)}
        finally:
            # The engine knows nothing of stop strings, so a stop-string finish is still running there.
            if not finished:
                log.info("request %s: client disconnected before the end; aborting it", req.rid)
            if not finished or out.matched_stop is not None:
                self.engine.abort(engine_rid)
            self._in_flight.discard(req.rid)
            if metrics is not None and not failed:
                aborted = not finished or finish_reason["type"] == "abort"
                metrics.finished(len(req.input_ids), len(out.output_ids), time.perf_counter() - t0, aborted)

    async def merged_outputs(
        self,
        reqs: Sequence[PreparedRequest],
        is_disconnected: Callable[[], Awaitable[bool]] = _never_disconnected,
        incremental: bool = False,
    ) -> AsyncIterator[dict]:
        """Outputs of a batch, interleaved as they come, each tagged with its `index` as SGLang does."""
        if len(reqs) == 1:
            async for output in self.outputs(reqs[0], is_disconnected, incremental):
                yield output
            return
        merged: asyncio.Queue[tuple[int, dict | BaseException | None]] = asyncio.Queue()

        async def pump(index: int, req: PreparedRequest) -> None:
            try:
                async for output in self.outputs(req, is_disconnected, incremental):
                    await merged.put((index, output))
                await merged.put((index, None))
            except BaseException as err:  # hand it to the consumer, which re-raises
                await merged.put((index, err))
                raise

        tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)]
        try:
            running = len(tasks)
            while running:
                index, item = await merged.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield {**item, "index": index}
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def final(
        self, reqs: Sequence[PreparedRequest], is_disconnected: Callable[[], Awaitable[bool]] = _never_disconnected
    ) -> list[dict] | None:
        """The finished output of each request in order, or None if the client went away first."""
        results: list[dict | None] = [None] * len(reqs)
        async for output in self.merged_outputs(reqs, is_disconnected):
            if output["meta_info"]["finish_reason"] is not None:
                results[output.pop("index", 0)] = output
        if any(r is None for r in results):
            return None
        return results
