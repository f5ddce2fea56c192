"""The embedded engine: continuous batching with chunked, optionally mixed prefill and speculative decoding, on one thread.

Each loop iteration: apply aborts, pick prompt tokens to prefill (SGLang's `--chunked-prefill-size`: at
most that many per forward; a longer prompt is split, and its rest goes first in the next iteration), then
- without `--enable-mixed-chunk`: one forward over those prompt chunks, then one decode step for every
  running sequence (a plain batched forward, or draft proposal + one batched verify forward);
- with it: the prompt chunks ride in the decode step's own target forward, so a refill no longer costs the
  running sequences a forward of its own.
A prompt whose last chunk was prefilled yields its first token and joins the running batch.
Running sequences always occupy KV slots 0..R-1 (a finished one's slot is refilled by moving the last
sequence into it) and the one partly prefilled prompt, if any, slot R, so every forward segment reads its
cache as a slice.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from workflow_scripts.engine.adaptive import AdaptiveSpeculativeParams, adaptive_unsupported_reason
from workflow_scripts.engine.model import DecoderModel, Segment
from workflow_scripts.engine.sampling import (
    RowParams, RowSeeds, choose_tokens, greedy_accept, sampling_probs, speculative_accept,
)  # fmt: skip
from workflow_scripts.engine.sequence import Sequence
from workflow_scripts.engine.simulated_acceptance import SimulatedAcceptance
from workflow_scripts.engine.speculative import Drafter, NgramDrafter, Proposal, StandaloneDrafter
from workflow_scripts.engine.torch_setup import configure_torch, torch_config
from workflow_scripts.engine.types import (
    DEFAULT_CHUNKED_PREFILL_SIZE,
    FORWARD_MODES,
    SEED_LIMIT,
    EngineConfigError,
    SamplingParams,
    SpecConfig,
    TokenEvent,
    chunked_prefill_problem,
)
from workflow_scripts.speculation_rules import NUMBER_KEYS, speculation_problem

logger = logging.getLogger(__name__)

ALGORITHMS = ("STANDALONE", "NGRAM")
DEFAULT_CONTEXT_LENGTH = 2048
# the per-mode totals the engine keeps: the wall time, the engine thread's CPU time and the number of its forwards
FORWARD_TOTALS = tuple(f"{mode}_{what}" for mode in FORWARD_MODES for what in ("seconds", "cpu_seconds", "forwards"))
MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default: bounds a prefill batch when chunking is off


@dataclass(frozen=True)
class PrefillRow:
    """Prompt tokens [start, start + length) of one sequence, prefilled in this iteration."""

    seq: Sequence
    start: int
    length: int

    @property
    def completes(self) -> bool:
        return self.start + self.length == self.seq.prompt_len


def prefill_segments(rows: list[PrefillRow]) -> list[Segment]:
    """Consecutive rows (consecutive slots) with equal chunk lengths share a segment: no padded tokens."""
    segments: list[Segment] = []
    for _, same_length in itertools.groupby(rows, key=lambda r: r.length):
        group = list(same_length)
        tokens = torch.tensor([r.seq.tokens[r.start : r.start + r.length] for r in group])
        segments.append(Segment(tokens, torch.tensor([r.start for r in group]), group[0].seq.slot))
    return segments


def validate_spec(spec: SpecConfig) -> None:
    """SGLang's rules for the speculative flags (topk 1 only), naming the flag at fault."""
    if spec.algorithm not in ALGORITHMS:
        raise EngineConfigError(f"--speculative-algorithm must be one of {ALGORITHMS}, got {spec.algorithm!r}")
    if spec.num_steps < (0 if spec.adaptive_config is not None else 1):  # adaptive may start on its 0-step tier
        raise EngineConfigError(f"--speculative-num-steps must be >= 1, got {spec.num_steps}")
    if spec.eagle_topk != 1:
        raise EngineConfigError(f"--speculative-eagle-topk {spec.eagle_topk} is not supported (only 1)")
    numbers = dict(zip(NUMBER_KEYS, (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens)))
    problem = speculation_problem(spec.algorithm, numbers, spec.draft_model_path)
    if problem:
        raise EngineConfigError(problem)
    if spec.algorithm == "STANDALONE" and spec.draft_model_path is None:
        raise EngineConfigError("--speculative-draft-model-path is required for STANDALONE")
    if spec.algorithm == "NGRAM" and spec.draft_model_path is not None:
        raise EngineConfigError("--speculative-draft-model-path must not be set for NGRAM")


def _finish_check(seq: Sequence, token: int, eos: frozenset[int], context_length: int) -> dict | None:
    if token in seq.stop_ids or (not seq.params.ignore_eos and token in eos):
        return {"type": "stop", "matched": token}
    if seq.output_len >= seq.params.max_new_tokens:
        return {"type": "length", "length": seq.params.max_new_tokens}
    if len(seq.tokens) >= context_length:
        return {"type": "length", "length": seq.output_len}
    return None


def _count_correct_drafts(histogram: list[int], correct: int) -> None:
    """SGLang's `Req.update_spec_correct_drafts_histogram`: bucket = accepted drafts (no bonus), grown on demand."""
    if len(histogram) <= correct:
        histogram.extend([0] * (correct + 1 - len(histogram)))
    histogram[correct] += 1


class Scheduler:
    """The embedded engine's scheduler (as SGLang's Scheduler): continuous batching of a Qwen3(-MoE) target's
    requests on CPU, with optional speculation; it batches the requests and runs the forwards.

    Thread-safety: submit/abort/stats may be called from any thread; sinks run on the engine thread.
    """

    def __init__(
        self,
        model_path: Path,
        spec: SpecConfig | None,
        max_running_requests: int,
        random_seed: int,
        context_length: int | None = None,
        num_threads: int | None = None,
        dtype: str = "auto",
        chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE,
        enable_mixed_chunk: bool = False,
    ):
        if max_running_requests < 1:
            raise EngineConfigError(f"--max-running-requests must be >= 1, got {max_running_requests}")
        if problem := chunked_prefill_problem(chunked_prefill_size):
            raise EngineConfigError(problem)
        configure_torch(num_threads)
        if spec is not None:
            validate_spec(spec)
        self.target = DecoderModel(Path(model_path), dtype)
        cfg = self.target.cfg
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = cfg.eos_token_ids
        self._eos = frozenset(cfg.eos_token_ids)
        limit = cfg.max_position_embeddings
        if context_length is not None and not 1 < context_length <= limit:
            raise EngineConfigError(f"--context-length must be in 2..{limit} (max_position_embeddings), got {context_length}")
        self.context_length = context_length or min(limit, DEFAULT_CONTEXT_LENGTH)
        self.spec = spec
        self.max_running_requests = max_running_requests
        # SGLang: -1 disables chunking, and mixing needs chunking (Scheduler.is_mixed_chunk).
        self.chunked_prefill_size = chunked_prefill_size if chunked_prefill_size > 0 else None
        self.enable_mixed_chunk = enable_mixed_chunk and self.chunked_prefill_size is not None
        if enable_mixed_chunk and not self.enable_mixed_chunk:
            logger.warning("--enable-mixed-chunk has no effect with --chunked-prefill-size -1 (as in SGLang)")
        if self.enable_mixed_chunk and spec is not None:
            logger.info("mixed chunked prefill stays on under %s speculation (SGLang turns it off there): prompt "
                        "chunks join the verify forward", spec.algorithm)
        self._adaptive = None
        if spec is not None and spec.adaptive_config is not None:
            try:
                self._adaptive = AdaptiveSpeculativeParams(spec.num_steps, spec.adaptive_config)
            except ValueError as err:
                raise EngineConfigError(f"--speculative-adaptive-config: {err}") from None
            if reason := adaptive_unsupported_reason(spec.algorithm, spec.eagle_topk):
                logger.warning("--speculative-adaptive: SGLang 0.5.23 runs static steps here (%s); the embedded engine "
                               "adapts, so that the rule can be measured on its own pair", reason)
        k = max(self._adaptive.candidate_steps) if self._adaptive else spec.num_steps if spec else 0
        capacity = self.context_length + k + 2  # room for verify/draft writes past the last token
        self.cache = self.target.new_cache(max_running_requests, capacity)
        self.drafter: Drafter | None = None
        if spec is not None and spec.algorithm == "STANDALONE":
            draft = DecoderModel(Path(spec.draft_model_path), self.target.dtype)
            if draft.cfg.vocab_size != cfg.vocab_size:
                raise EngineConfigError(
                    f"draft model {spec.draft_model_path} has vocab_size {draft.cfg.vocab_size}, "
                    f"target {model_path} has {cfg.vocab_size}"
                )
            self.drafter = StandaloneDrafter(draft, max_running_requests, capacity)
        elif spec is not None:
            self.drafter = NgramDrafter()
        self._generator = torch.Generator().manual_seed(random_seed)  # request seeds when none is given
        try:  # SGLANG_SIMULATE_ACC_LEN (simulated_acceptance.py), drawn from its own stream
            self._simulated = SimulatedAcceptance.from_env() if spec is not None else None
        except ValueError as err:
            raise EngineConfigError(str(err)) from None
        self._simulated_rng = torch.Generator().manual_seed(random_seed)
        self._lock = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._aborts: dict[str, str] = {}
        self._outbox: dict[Callable[[TokenEvent], None], list[TokenEvent]] = {}  # this step's events, per sink
        self._running: list[Sequence] = []
        self._chunked: Sequence | None = None  # SGLang's chunked_req: a prompt prefilled in part, in slot len(_running)
        self._known: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # whether the engine thread's CPU clock holds a forward's whole work: only when torch computes on that
        # thread alone; set by the thread itself (torch's thread count is per thread)
        self._cpu_clock_whole: bool | None = None
        self.torch_config: dict = {}  # the scheduling thread's torch setup (torch_setup.torch_config), once started
        self._loop_ready = threading.Event()
        self._totals = {"verify_ct": 0, "spec_tokens": 0, "accepted": 0, "proposed": 0, "finished": 0, "generated": 0,
                        "stall_forwards": 0, "prefill_tokens": 0, "adaptive_switches": 0, **dict.fromkeys(FORWARD_TOTALS, 0)}

    # ---- public, thread-safe -------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduling thread (idempotent); returns once it has read its torch setup."""
        if self._thread is None:
            self._stopping = False
            self._loop_ready.clear()
            self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
            self._thread.start()
            self._loop_ready.wait()

    def stop(self) -> None:
        """Stop the loop; requests still held get a final abort event."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for seq in [*self._running, *self._held_chunked(), *self._waiting]:
            self._emit(seq, [], {"type": "abort", "message": "engine stopped"})
        self._deliver()
        self._running.clear()
        self._chunked = None
        self._waiting.clear()

    def submit(self, rid: str, input_ids: list[int], params: SamplingParams, sink: Callable[[TokenEvent], None]) -> None:
        """Queue a request; raises ValueError (naming the field) for input the engine cannot run."""
        if not input_ids:
            raise ValueError("input_ids: empty prompt")
        if len(input_ids) >= self.context_length:
            raise ValueError(f"input_ids: prompt of {len(input_ids)} tokens does not fit context_length {self.context_length}")
        if min(input_ids) < 0 or max(input_ids) >= self.vocab_size:
            raise ValueError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        if params.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {params.max_new_tokens}")
        if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k == 0 or params.top_k < -1:
            raise ValueError("sampling_params: need temperature >= 0, 0 < top_p <= 1, top_k == -1 or >= 1")
        with self._lock:
            if rid in self._known:
                raise ValueError(f"rid: {rid!r} is already running")
            # without sampling_seed, the server's seed (--random-seed) and the arrival order pick one
            seed = params.sampling_seed if params.sampling_seed is not None else int(
                torch.randint(0, SEED_LIMIT - 1, (1,), generator=self._generator))
            seq = Sequence(rid, list(input_ids), len(input_ids), params, sink,
                           stop_ids=frozenset(params.stop_token_ids), seed=seed % SEED_LIMIT)
            self._known.add(rid)
            self._waiting.append(seq)
            self._lock.notify_all()

    def abort(self, rid: str, message: str = "aborted by client") -> None:
        """Drop a request between steps; it gets one final event with finish_reason type 'abort'.

        Unknown or already finished rids are ignored.
        """
        with self._lock:
            if rid in self._known:
                self._aborts[rid] = message
                self._lock.notify_all()

    def stats(self) -> dict:
        """Counters for /server_info; avg_spec_accept_length = tokens per verify forward since start.

        num_running counts the partly prefilled prompt too: it holds a slot.
        """
        with self._lock:
            t = dict(self._totals)
            running, waiting = len(self._running) + (self._chunked is not None), len(self._waiting)
        return {
            "avg_spec_accept_length": t["spec_tokens"] / t["verify_ct"] if t["verify_ct"] else 0.0,
            "num_running": running,
            "num_waiting": waiting,
            "max_running_requests": self.max_running_requests,
            "context_length": self.context_length,
            "chunked_prefill_size": self.chunked_prefill_size or -1,
            "enable_mixed_chunk": self.enable_mixed_chunk,
            "total_verify_ct": t["verify_ct"],
            "total_accepted_drafts": t["accepted"],
            "total_proposed_drafts": t["proposed"],
            "total_generated_tokens": t["generated"],
            "total_prefill_tokens": t["prefill_tokens"],
            "total_forwards": sum(t[f"{mode}_forwards"] for mode in FORWARD_MODES),
            "total_stall_forwards": t["stall_forwards"],  # prefill-only forwards that running sequences waited for
            "total_adaptive_switches": t["adaptive_switches"],  # tier changes under --speculative-adaptive
            # wall and CPU time and count of each kind of forward (total_mixed_forwards among them), drafting and
            # verifying included (SGLang's ForwardMode names): what share of a cell a speculative setting can speed up
            # at all (the prefill's is not), and what one speculative step costs against a plain decode step
            **{f"total_{name}": t[name] for name in FORWARD_TOTALS},
            # the CPU seconds cover a forward only where torch runs it on the engine thread alone (one torch thread)
            "forward_cpu_clock_whole": bool(self._cpu_clock_whole),
            "num_finished": t["finished"],
        }

    # ---- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        self._cpu_clock_whole = torch.get_num_threads() == 1
        with torch.inference_mode():
            self.torch_config = torch_config()
            self._loop_ready.set()
            while True:
                with self._lock:
                    while not self._stopping and not self._running and not self._waiting and self._chunked is None:
                        self._lock.wait(timeout=1.0)
                    if self._stopping:
                        return
                    aborts, self._aborts = self._aborts, {}
                try:
                    self._apply_aborts(aborts)
                    with self._lock:
                        rows, empty = self._schedule_prefill()
                    for seq in empty:
                        self._finish(seq, [], {"type": "length", "length": 0})
                    self._deliver()
                    if self.enable_mixed_chunk:
                        if rows or self._running:
                            self._forward(rows, decode=bool(self._running))
                    else:
                        if rows:
                            self._forward(rows, decode=False)
                        if self._running:
                            self._forward([], decode=True)
                except Exception as e:  # keep serving: fail the batch in flight, not the server
                    held = [*self._running, *self._held_chunked()]
                    logger.exception("engine step failed; aborting %d running requests", len(held))
                    for seq in held:
                        if not seq.finished:
                            self._finish(seq, [], {"type": "abort", "message": f"engine error: {e}"})
                    self._chunked = None
                    self._compact()
                    self._deliver()

    def _held_chunked(self) -> list[Sequence]:
        return [self._chunked] if self._chunked is not None else []

    def _schedule_prefill(self) -> tuple[list[PrefillRow], list[Sequence]]:
        """Prompt tokens to prefill this iteration, as SGLang's PrefillAdder picks them (caller holds the lock).

        The partly prefilled prompt continues first; then waiting requests take free slots in order while the
        token budget lasts: --chunked-prefill-size, less one token per running request when mixing (SGLang's
        mixed_with_decode_tokens). The last one admitted may get only a chunk; it becomes the chunked request.
        Without chunking, whole prompts up to MAX_PREFILL_TOKENS (the first one always).
        Returns (rows, empty): empty ones asked for 0 new tokens and need no slot.
        """
        chunking = self.chunked_prefill_size is not None
        budget = self.chunked_prefill_size if chunking else MAX_PREFILL_TOKENS
        if self.enable_mixed_chunk:
            budget -= len(self._running)
        rows: list[PrefillRow] = []
        empty: list[Sequence] = []
        if self._chunked is not None:
            seq = self._chunked
            if budget <= 0:
                return rows, empty
            length = min(seq.prompt_len - seq.prefilled, budget)
            rows.append(PrefillRow(seq, seq.prefilled, length))
            budget -= length
            if not rows[-1].completes:
                return rows, empty
        slots = self.max_running_requests - len(self._running) - len(rows)
        while self._waiting and slots > 0 and budget > 0:
            seq = self._waiting[0]
            if seq.params.max_new_tokens == 0:
                empty.append(self._waiting.popleft())
                continue
            if not chunking and rows and seq.prompt_len > budget:
                break
            self._waiting.popleft()
            seq.slot = len(self._running) + len(rows)
            length = min(seq.prompt_len, budget) if chunking else seq.prompt_len
            rows.append(PrefillRow(seq, 0, length))
            budget -= length
            slots -= 1
        last = rows[-1] if rows else None
        self._chunked = last.seq if last is not None and not last.completes else None
        return rows, empty

    def _apply_aborts(self, aborts: dict[str, str]) -> None:
        if not aborts:
            return
        for seq in [*self._running, *self._held_chunked()]:
            if seq.rid in aborts:
                self._finish(seq, [], {"type": "abort", "message": aborts.pop(seq.rid)})
        if self._chunked is not None and self._chunked.finished:
            self._chunked = None
        with self._lock:
            kept = deque()
            for seq in self._waiting:
                if seq.rid in aborts:
                    self._finish(seq, [], {"type": "abort", "message": aborts.pop(seq.rid)})
                else:
                    kept.append(seq)
            self._waiting = kept
        self._compact()

    def _finish(self, seq: Sequence, new_ids: list[int], reason: dict) -> None:
        seq.finished = True
        self._emit(seq, new_ids, reason)
        with self._lock:
            self._known.discard(seq.rid)
            self._totals["finished"] += 1

    def _compact(self) -> None:
        """Drop finished sequences, refilling each freed slot with the last running sequence; then move the
        partly prefilled prompt, if any, to the slot right after the running ones."""
        for seq in sorted(self._running, key=lambda s: -s.slot):
            if not seq.finished:
                continue
            last = self._running.pop()
            if last is not seq:
                self._move(last, seq.slot)
                self._running[seq.slot] = last
        if self._chunked is not None and self._chunked.slot != len(self._running):
            self._move(self._chunked, len(self._running))

    def _move(self, seq: Sequence, slot: int) -> None:
        self.cache.move_slot(seq.slot, slot, seq.cache_len)
        if self.drafter is not None:
            self.drafter.move_slot(seq.slot, slot, seq.draft_len)
        seq.slot = slot

    def _emit(self, seq: Sequence, new_ids: list[int], reason: dict | None) -> None:
        event = TokenEvent(
            rid=seq.rid,
            new_ids=new_ids,
            finished=reason is not None,
            finish_reason=reason,
            completion_tokens=seq.output_len,
            spec_verify_ct=seq.verify_ct,
            spec_accepted_drafts=seq.accepted,
            spec_proposed_drafts=seq.proposed,
            spec_correct_drafts_histogram=tuple(seq.correct_drafts_histogram),
        )
        self._outbox.setdefault(seq.sink, []).append(event)

    def _deliver(self) -> None:
        """Hand the events of the step just run to their sinks: one call per sink with a `batch` method (the engine
        process sends one ZMQ message per forward, as SGLang's scheduler sends one BatchTokenIDOut), else one call
        per event. Called after every forward, so a first token waits for no other forward."""
        outbox, self._outbox = self._outbox, {}
        for sink, events in outbox.items():
            try:
                batch = getattr(sink, "batch", None)
                if batch is not None:
                    batch(events)
                else:
                    for event in events:
                        sink(event)
            except Exception:
                logger.exception("sink of request %s raised; the request continues", events[0].rid)

    def _commit(self, seq: Sequence, new_ids: list[int]) -> None:
        """Append tokens one by one, stopping at EOS/stop ids/limits, then emit one event."""
        committed: list[int] = []
        reason = None
        for tok in new_ids:
            seq.tokens.append(tok)
            committed.append(tok)
            reason = _finish_check(seq, tok, self._eos, self.context_length)
            if reason is not None:
                break
        with self._lock:
            self._totals["generated"] += len(committed)
        if reason is None:
            self._emit(seq, committed, None)
        else:
            self._finish(seq, committed, reason)

    def _row_params(self, seqs: list[Sequence]) -> RowParams:
        return RowParams(
            temperature=torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32),
            top_p=torch.tensor([s.params.top_p for s in seqs], dtype=torch.float32),
            top_k=torch.tensor([s.params.top_k for s in seqs], dtype=torch.long),
        )

    @staticmethod
    def _row_seeds(seqs: list[Sequence]) -> RowSeeds:
        return RowSeeds(torch.tensor([s.seed for s in seqs], dtype=torch.long),
                        torch.tensor([s.output_len for s in seqs], dtype=torch.long))

    def _forward(self, rows: list[PrefillRow], decode: bool) -> None:
        """One target forward: a decode (or draft-verify) segment over the running sequences when `decode`,
        plus the prompt chunks in `rows`. Prompts whose last chunk this was sample their first token and
        join the running batch. Its wall time counts under its mode (FORWARD_MODES), and so does this thread's CPU
        time: unlike the wall time, that clock stands still while the process is stopped (a time-sliced cell,
        client/slicing.py) or waits for a core."""
        t0, c0 = time.perf_counter(), time.thread_time()
        seqs = list(self._running) if decode else []
        segments: list[Segment] = []
        proposal = params = seeds = None
        if seqs:
            params, seeds = self._row_params(seqs), self._row_seeds(seqs)
            last = torch.tensor([[s.tokens[-1]] for s in seqs])
            start = torch.tensor([s.cache_len for s in seqs])
            steps = self._adaptive.steps_for_batch(len(seqs)) if self._adaptive else self.spec.num_steps if self.spec else 0
            if self.drafter is not None and steps > 0:  # an adaptive 0-step tier decodes plainly
                proposal = self.drafter.propose(seqs, params, steps, seeds)
                last = torch.cat([last, proposal.tokens], dim=1)
            segments.append(Segment(last, start, 0))
        chunks = prefill_segments(rows)
        hidden = self.target.forward_segments(segments + chunks, self.cache)
        with self._lock:
            self._totals["stall_forwards"] += bool(rows and not seqs and self._running)
            self._totals["prefill_tokens"] += sum(r.length for r in rows)
        if seqs:
            if proposal is None:
                logits = self.target.logits(hidden[0][:, 0])
                for seq, tok in zip(seqs, choose_tokens(logits, params, seeds).tolist()):
                    self._commit(seq, [tok])
                if self._adaptive is not None:  # SGLang feeds its 0-step tier's verifies as 0 accepted drafts
                    self._adapt([0] * len(seqs))
            else:
                self._verify(seqs, params, seeds, proposal, self.target.logits(hidden[0]))
        if rows:
            self._end_prefill(rows, chunks, hidden[len(segments):])
        mode = "mixed" if seqs and rows else "decode" if seqs else "extend"
        with self._lock:
            self._totals[f"{mode}_seconds"] += time.perf_counter() - t0
            self._totals[f"{mode}_cpu_seconds"] += time.thread_time() - c0
            self._totals[f"{mode}_forwards"] += 1
        self._compact()
        self._deliver()

    def _adapt(self, correct_drafts: list[int]) -> None:
        """Feed one decode batch's accepted drafts to its batch-size entry; the next forward uses its tier."""
        before = self._adaptive.steps_for_batch(len(correct_drafts))
        if (after := self._adaptive.on_verify_complete(correct_drafts, len(correct_drafts))) is not None:
            logger.info("Adaptive spec params updated: steps %d -> %d (batch size %d)", before, after, len(correct_drafts))
            with self._lock:
                self._totals["adaptive_switches"] += 1

    def _end_prefill(self, rows: list[PrefillRow], chunks: list[Segment], hidden: list[torch.Tensor]) -> None:
        """Record the prefilled chunks (target and draft caches) and give completed prompts their first token."""
        for r in rows:
            r.seq.prefilled = r.start + r.length
        if self.drafter is not None:
            self.drafter.prefill([r.seq for r in rows], chunks)
        done = [i for i, r in enumerate(rows) if r.completes]
        if not done:
            return
        last_hidden = torch.cat([h[:, -1] for h in hidden])  # [rows, H]: every chunk's last position
        seqs = [rows[i].seq for i in done]
        logits = self.target.logits(last_hidden[done])
        first = choose_tokens(logits, self._row_params(seqs), self._row_seeds(seqs)).tolist()
        for seq, tok in zip(seqs, first):
            self._running.append(seq)  # its slot is len(_running) already: completed rows precede the chunked one
            self._commit(seq, [tok])

    def _verify(self, seqs: list[Sequence], params: RowParams, seeds: RowSeeds, proposal: Proposal,
                logits: torch.Tensor) -> None:
        """Keep each row's accepted run of drafts plus the target's next token (lossless rejection sampling)."""
        B, K = proposal.tokens.shape
        if params.all_greedy:
            accepted, nxt = greedy_accept(logits.argmax(-1), proposal.tokens, proposal.num)
        else:
            V = self.vocab_size
            target_probs = sampling_probs(logits.view(B * (K + 1), V), params.repeat(K + 1)).view(B, K + 1, V)
            accepted, nxt = speculative_accept(target_probs, proposal.tokens, proposal.probs, proposal.num, seeds)
        tokens, drafts_kept = proposal.tokens, True
        if self._simulated is not None:
            accepted, nxt, tokens = self._simulated.accept(proposal.tokens, logits, self._simulated_rng)
            drafts_kept = self._simulated.token_mode == "real-draft-token"  # else the draft cache saw other tokens
        drafts = tokens.tolist()
        nums = proposal.num.tolist()
        if self._adaptive is not None:
            self._adapt(accepted.tolist())
        with self._lock:
            self._totals["verify_ct"] += B
            self._totals["proposed"] += sum(nums)
            self._totals["accepted"] += int(accepted.sum())
            self._totals["spec_tokens"] += int(accepted.sum()) + B
        for seq, m, tok, row, n in zip(seqs, accepted.tolist(), nxt.tolist(), drafts, nums):
            committed_before = len(seq.tokens)
            seq.verify_ct += 1
            seq.accepted += m
            seq.proposed += n
            _count_correct_drafts(seq.correct_drafts_histogram, m)
            seq.draft_len = min(seq.draft_len, committed_before + (m if drafts_kept else 0))
            self._commit(seq, row[:m] + [tok])
