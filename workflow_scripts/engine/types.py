"""Types shared by the embedded engine and the HTTP server.

The server codes against these names only. The engine itself is
`workflow_scripts.engine.scheduler.Scheduler`:

    Scheduler(model_path, spec, max_running_requests, random_seed, context_length=None,
           num_threads=None,   # torch threads; None => $SPECSTUDY_ENGINE_THREADS, else 1 (engine/torch_setup.py)
           dtype="auto",       # SGLang's --dtype: auto (config.json's), float32 or bfloat16
           chunked_prefill_size=DEFAULT_CHUNKED_PREFILL_SIZE,  # SGLang's flag: max prompt tokens per forward; -1: no chunking
           enable_mixed_chunk=False)  # SGLang's flag: prompt chunks ride in the running batch's decode forward
    .vocab_size, .eos_token_ids, .context_length
    .start() / .stop()                      # start() returns once the scheduling thread runs
    .torch_config                           # that thread's torch setup (engine/torch_setup.py), once started
    .submit(rid, input_ids, params, sink)   # thread-safe; sink(TokenEvent) is called from the engine thread;
                                            # raises ValueError naming the field (empty/too long prompt, bad ids/params)
    .abort(rid)                             # thread-safe; frees the slot and emits ONE final event with
                                            # finish_reason {"type": "abort", ...}, unless rid already finished
                                            # (then nothing happens)
    .stats() -> dict                        # avg_spec_accept_length, num_running, num_waiting, ...

`sink` must be cheap and non-blocking (e.g. loop.call_soon_threadsafe onto an asyncio queue): it runs
on the scheduling thread, and a slow sink slows every request. The events of one forward reach each sink after
that forward, through `sink.batch(list_of_events)` when the sink has such a method (one call, as SGLang's
scheduler sends one BatchTokenIDOut per forward), else through `sink(event)` one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


# SGLang sizes --chunked-prefill-size by device memory (2048..16384; 8192 for 60-160 GB). The embedded engine keeps
# the prefill budget it had before chunking existed.
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
# the kinds of target forward, by SGLang's ForwardMode: running rows only, prompt chunks only, or both at once
FORWARD_MODES = ("decode", "extend", "mixed")


def chunked_prefill_problem(size: int) -> str | None:
    """What is wrong with a --chunked-prefill-size (SGLang's meaning: a token budget, or -1 for no chunking)."""
    if size != -1 and size < 1:
        return f"--chunked-prefill-size must be -1 (disabled) or >= 1, got {size}"
    return None


class EngineConfigError(ValueError):
    """Bad model dir / draft vocab mismatch / bad spec config; the message names the path or flag."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling knobs, with SGLang's meanings."""

    temperature: float = 1.0  # 0 => greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 => off
    max_new_tokens: int = 128
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    sampling_seed: int | None = None  # the request's own random stream; None => the engine draws one


# request seeds are kept in [0, 2**63): an int64 tensor holds them
SEED_LIMIT = 1 << 63


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings, named after SGLang's --speculative-* flags."""

    algorithm: str  # "STANDALONE" | "NGRAM"
    num_steps: int
    eagle_topk: int  # only 1 supported
    num_draft_tokens: int  # == num_steps + 1 with topk 1
    draft_model_path: Path | None  # required for STANDALONE, None for NGRAM
    # --speculative-adaptive: SGLang's adaptive config (engine/adaptive.py) whose tiers replace num_steps at run
    # time, num_steps being the starting tier; None = static steps
    adaptive_config: dict | None = None


@dataclass(frozen=True)
class TokenEvent:
    """Emitted for a request after every engine step that committed tokens to it (or finished it)."""

    rid: str
    new_ids: list[int]  # tokens committed this step (1..num_steps+1 under speculation; may be [] on abort)
    finished: bool
    finish_reason: dict | None  # {"type": "length", "length": n} | {"type": "stop", "matched": id} | {"type": "abort", "message": ...}
    completion_tokens: int
    spec_verify_ct: int  # target verify forwards for this request so far (0 when not speculating)
    spec_accepted_drafts: int
    spec_proposed_drafts: int
    # SGLang's spec_correct_drafts_histogram: [i] = verify forwards that accepted exactly i drafts (bonus token
    # not counted); as long as the largest count seen + 1, so it sums to spec_verify_ct. () when not speculating.
    spec_correct_drafts_histogram: tuple[int, ...] = ()
