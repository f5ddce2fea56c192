"""The embedded engine: continuous batching with optional speculative decoding, on one thread.

Each loop iteration: apply aborts, admit waiting requests up to max_running_requests (one ragged
prefill forward for all of them, which also yields their first token), then one decode step for
every running sequence: a plain batched forward, or draft proposal + one batched verify forward.
Running sequences always occupy KV slots 0..B-1 (a finished one's slot is refilled by moving the
last sequence into it), so every batched forward reads its cache as a slice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from workflow_scripts.engine.model import DecoderModel
from workflow_scripts.engine.sampling import RowParams, choose_tokens, greedy_accept, sampling_probs, speculative_accept
from workflow_scripts.engine.speculative import Drafter, NgramDrafter, StandaloneDrafter, pad_rows
from workflow_scripts.engine.types import EngineConfigError, SamplingParams, SpecConfig, TokenEvent
from workflow_scripts.speculation_rules import NUMBER_KEYS, speculation_problem

logger = logging.getLogger(__name__)

ALGORITHMS = ("STANDALONE", "NGRAM")
DEFAULT_CONTEXT_LENGTH = 2048
THREADS_ENV = "SPECSTUDY_ENGINE_THREADS"
PREFILL_TOKEN_BUDGET = 8192  # padded tokens per prefill forward; more waits for the next iteration


@dataclass
class Sequence:
    """A request's state while the engine holds it."""

    rid: str
    tokens: list[int]  # prompt + committed output; the last token is not yet in the target cache
    prompt_len: int
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    slot: int = -1
    draft_len: int = 0  # positions held by the draft cache (STANDALONE)
    verify_ct: int = 0
    accepted: int = 0
    proposed: int = 0
    correct_drafts_histogram: list[int] = field(default_factory=list)  # [i] = verifies that accepted i drafts
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    finished: bool = False

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


def validate_spec(spec: SpecConfig) -> None:
    """SGLang's rules for the speculative flags (topk 1 only), naming the flag at fault."""
    if spec.algorithm not in ALGORITHMS:
        raise EngineConfigError(f"--speculative-algorithm must be one of {ALGORITHMS}, got {spec.algorithm!r}")
    if spec.num_steps < 1:
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


class Engine:
    """Continuous-batching CPU engine for a Qwen3(-MoE) target with optional speculation.

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
    ):
        if max_running_requests < 1:
            raise EngineConfigError(f"--max-running-requests must be >= 1, got {max_running_requests}")
        threads = num_threads or int(os.environ.get(THREADS_ENV, "0"))
        if threads > 0:
            torch.set_num_threads(threads)
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
        k = spec.num_steps if spec else 0
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
        self._generator = torch.Generator().manual_seed(random_seed)
        self._lock = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._aborts: dict[str, str] = {}
        self._running: list[Sequence] = []
        self._known: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._totals = {"verify_ct": 0, "spec_tokens": 0, "accepted": 0, "proposed": 0, "finished": 0, "generated": 0}

    # ---- public, thread-safe -------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduling thread (idempotent)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the loop; requests still held get a final abort event."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for seq in [*self._running, *self._waiting]:
            self._emit(seq, [], {"type": "abort", "message": "engine stopped"})
        self._running.clear()
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
        seq = Sequence(rid, list(input_ids), len(input_ids), params, sink, stop_ids=frozenset(params.stop_token_ids))
        with self._lock:
            if rid in self._known:
                raise ValueError(f"rid: {rid!r} is already running")
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
        """Counters for /server_info; avg_spec_accept_length = tokens per verify forward since start."""
        with self._lock:
            t = dict(self._totals)
            running, waiting = len(self._running), len(self._waiting)
        return {
            "avg_spec_accept_length": t["spec_tokens"] / t["verify_ct"] if t["verify_ct"] else 0.0,
            "num_running": running,
            "num_waiting": waiting,
            "max_running_requests": self.max_running_requests,
            "context_length": self.context_length,
            "total_verify_ct": t["verify_ct"],
            "total_accepted_drafts": t["accepted"],
            "total_proposed_drafts": t["proposed"],
            "total_generated_tokens": t["generated"],
            "num_finished": t["finished"],
        }

    # ---- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self._stopping and not self._running and not self._waiting:
                        self._lock.wait(timeout=1.0)
                    if self._stopping:
                        return
                    aborts, self._aborts = self._aborts, {}
                try:
                    self._apply_aborts(aborts)
                    with self._lock:
                        admitted, empty = self._admit()
                    for seq in empty:
                        self._finish(seq, [], {"type": "length", "length": 0})
                    if admitted:
                        self._prefill(admitted)
                    if self._running:
                        self._step()
                except Exception as e:  # keep serving: fail the batch in flight, not the server
                    logger.exception("engine step failed; aborting %d running requests", len(self._running))
                    for seq in self._running:
                        if not seq.finished:
                            self._finish(seq, [], {"type": "abort", "message": f"engine error: {e}"})
                    self._compact()

    def _admit(self) -> tuple[list[Sequence], list[Sequence]]:
        """Move waiting requests into free slots (caller holds the lock).

        Returns (admitted, empty): empty ones asked for 0 new tokens and need no slot.
        """
        admitted: list[Sequence] = []
        empty: list[Sequence] = []
        width = 0
        while self._waiting and len(self._running) < self.max_running_requests:
            seq = self._waiting[0]
            width = max(width, len(seq.tokens))
            if admitted and width * (len(admitted) + 1) > PREFILL_TOKEN_BUDGET:
                break
            self._waiting.popleft()
            if seq.params.max_new_tokens == 0:
                empty.append(seq)
                continue
            seq.slot = len(self._running)
            self._running.append(seq)
            admitted.append(seq)
        return admitted, empty

    def _apply_aborts(self, aborts: dict[str, str]) -> None:
        if not aborts:
            return
        for seq in list(self._running):
            if seq.rid in aborts:
                self._finish(seq, [], {"type": "abort", "message": aborts.pop(seq.rid)})
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
        """Drop finished sequences, refilling each freed slot with the last running sequence."""
        for seq in sorted(self._running, key=lambda s: -s.slot):
            if not seq.finished:
                continue
            last = self._running.pop()
            if last is not seq:
                self.cache.move_slot(last.slot, seq.slot, last.cache_len)
                if self.drafter is not None:
                    self.drafter.move_slot(last.slot, seq.slot, last.draft_len)
                last.slot = seq.slot
                self._running[seq.slot] = last

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
        try:
            seq.sink(event)
        except Exception:
            logger.exception("sink for request %s raised; the request continues", seq.rid)

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

    def _prefill(self, seqs: list[Sequence]) -> None:
        """One ragged forward over the new prompts; samples each one's first token."""
        offset = seqs[0].slot
        tokens, lens = pad_rows([s.tokens for s in seqs])
        hidden = self.target.forward(tokens, torch.zeros(len(seqs), dtype=torch.long), self.cache, offset)
        logits = self.target.logits(hidden[torch.arange(len(seqs)), lens - 1])
        if self.drafter is not None:
            self.drafter.prefill(seqs, offset)
        first = choose_tokens(logits, self._row_params(seqs), self._generator).tolist()
        for seq, tok in zip(seqs, first):
            self._commit(seq, [tok])
        self._compact()

    def _step(self) -> None:
        seqs = list(self._running)
        params = self._row_params(seqs)
        if self.drafter is None:
            last = torch.tensor([[s.tokens[-1]] for s in seqs])
            start = torch.tensor([s.cache_len for s in seqs])
            logits = self.target.logits(self.target.forward(last, start, self.cache)[:, 0])
            for seq, tok in zip(seqs, choose_tokens(logits, params, self._generator).tolist()):
                self._commit(seq, [tok])
        else:
            self._spec_step(seqs, params)
        self._compact()

    def _spec_step(self, seqs: list[Sequence], params: RowParams) -> None:
        """Draft k tokens per sequence, verify all of them in one target forward, keep the accepted run."""
        k = self.spec.num_steps
        proposal = self.drafter.propose(seqs, params, k, self._generator)
        B, K = proposal.tokens.shape
        last = torch.tensor([[s.tokens[-1]] for s in seqs])
        start = torch.tensor([s.cache_len for s in seqs])
        hidden = self.target.forward(torch.cat([last, proposal.tokens], dim=1), start, self.cache)
        logits = self.target.logits(hidden)
        if params.all_greedy:
            accepted, nxt = greedy_accept(logits.argmax(-1), proposal.tokens, proposal.num)
        else:
            V = self.vocab_size
            target_probs = sampling_probs(logits.view(B * (K + 1), V), params.repeat(K + 1)).view(B, K + 1, V)
            accepted, nxt = speculative_accept(target_probs, proposal.tokens, proposal.probs, proposal.num, self._generator)
        drafts = proposal.tokens.tolist()
        nums = proposal.num.tolist()
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
            seq.draft_len = min(seq.draft_len, committed_before + m)
            self._commit(seq, row[:m] + [tok])
