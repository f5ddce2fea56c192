"""One streamed request against an SGLang-compatible server, timed chunk by chunk.

Speaks SGLang's native `POST /generate` (the default: it returns per-request `meta_info` with the
speculation counters), OpenAI's `POST /v1/completions` (api `openai`) and `POST /v1/chat/completions` (api `chat`:
the prompt's text as one user message, which the server wraps in the model's chat template). All timestamps come from `time.perf_counter()`,
one monotonic clock per process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, field

import aiohttp

from workflow_scripts.client.prompts import Prompt


@dataclass
class RequestRecord:
    """What the client saw for one request; the columns of requests/{setting}.parquet (see DESIGN.md)."""

    request_id: str
    prompt_id: int
    send_ts: float
    sampling_seed: int | None = None  # the request's random stream (sampling_params.sampling_seed), if it had one
    first_token_ts: float | None = None
    chunk_ts: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    end_ts: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    # SGLang's per-request speculation counts, None when the server does not report them (no speculation)
    spec_correct_drafts_histogram: list[int] | None = None
    spec_num_correct_drafts: int | None = None
    spec_num_proposed_drafts: int | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    error: str | None = None

    def as_row(self) -> dict:
        row = {k: v for k, v in self.__dict__.items() if k != "text"}
        row["ttft_s"] = None if self.first_token_ts is None else self.first_token_ts - self.send_ts
        row["e2e_s"] = None if self.end_ts is None or self.error else self.end_ts - self.send_ts
        row["text_hash"] = hashlib.sha256(self.text.encode()).hexdigest()
        return row


def generate_payload(prompt: Prompt, params: dict) -> dict:
    body: dict = {"sampling_params": params, "stream": True}
    if prompt.input_ids is not None:
        body["input_ids"] = prompt.input_ids
    else:
        body["text"] = prompt.text
    return body


def completions_payload(prompt: Prompt, params: dict, model: str) -> dict:
    seed = {"seed": params["sampling_seed"]} if "sampling_seed" in params else {}  # OpenAI's name for it
    return {
        **seed,
        "model": model,
        "prompt": prompt.input_ids if prompt.input_ids is not None else prompt.text,
        "max_tokens": params["max_new_tokens"],
        "temperature": params["temperature"],
        "top_p": params["top_p"],
        "top_k": params["top_k"],
        "ignore_eos": params["ignore_eos"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_payload(prompt: Prompt, params: dict, model: str) -> dict:
    if prompt.text is None:
        raise ValueError(f"prompt {prompt.prompt_id}: the chat API needs the prompt's text, it has only token ids")
    body = completions_payload(prompt, params, model)
    del body["prompt"]
    return {**body, "messages": [{"role": "user", "content": prompt.text}]}


async def _sse_events(resp: aiohttp.ClientResponse):
    """Yield the JSON payload of each `data:` line until `data: [DONE]`."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _on_generate_chunk(rec: RequestRecord, chunk: dict, now: float, incremental: bool = False) -> None:
    """Fold one /generate chunk into the record; `incremental`: the server streams deltas
    (SGLang's --incremental-streaming-output), else each chunk carries the whole text and output_ids so far."""
    meta = chunk.get("meta_info", {})
    done = meta.get("completion_tokens", 0)
    seen = sum(rec.chunk_tokens)
    if done > seen:
        if rec.first_token_ts is None:
            rec.first_token_ts = now
        rec.chunk_ts.append(now)
        rec.chunk_tokens.append(done - seen)
    ids = chunk.get("output_ids") or []
    if incremental:
        rec.output_ids.extend(ids)
        rec.text += chunk.get("text", "")
    else:
        rec.output_ids = list(ids)
        rec.text = chunk.get("text", rec.text)
    rec.prompt_tokens = meta.get("prompt_tokens", rec.prompt_tokens)
    rec.output_tokens = done
    reason = meta.get("finish_reason")
    if reason:
        rec.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
        if rec.finish_reason == "abort":
            rec.error = f"server aborted the request: {reason}"
    if "spec_verify_ct" in meta:
        rec.spec_verify_ct = meta["spec_verify_ct"]
        rec.accept_length = meta.get("spec_accept_length") or (done / meta["spec_verify_ct"] if meta["spec_verify_ct"] else None)
        rec.spec_correct_drafts_histogram = meta.get("spec_correct_drafts_histogram", rec.spec_correct_drafts_histogram)
        rec.spec_num_correct_drafts = meta.get("spec_num_correct_drafts", rec.spec_num_correct_drafts)
        rec.spec_num_proposed_drafts = meta.get("spec_num_proposed_drafts", rec.spec_num_proposed_drafts)


def _on_openai_chunk(rec: RequestRecord, chunk: dict, now: float, text_of) -> None:
    usage = chunk.get("usage")
    if usage:
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.output_tokens = usage.get("completion_tokens")
    for choice in chunk.get("choices", []):
        text = text_of(choice)
        if text:
            if rec.first_token_ts is None:
                rec.first_token_ts = now
            rec.chunk_ts.append(now)
            rec.text += text
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]


def _on_completions_chunk(rec: RequestRecord, chunk: dict, now: float) -> None:
    _on_openai_chunk(rec, chunk, now, lambda choice: choice.get("text"))


def _on_chat_chunk(rec: RequestRecord, chunk: dict, now: float) -> None:
    _on_openai_chunk(rec, chunk, now, lambda choice: (choice.get("delta") or {}).get("content"))


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    api: str,
    prompt: Prompt,
    params: dict,
    request_id: str,
    model: str,
    incremental: bool = False,
    api_key: str | None = None,
) -> RequestRecord:
    """Send one streaming request; never raises for a server-side failure: the error text lands in the record.

    `incremental`: the server was started with --incremental-streaming-output (the record is the same either way).
    `api_key`: sent as `Authorization: Bearer` (the server's --api-key).
    """
    if api == "generate":
        url, body = f"{base_url}/generate", generate_payload(prompt, params)
        on_chunk = functools.partial(_on_generate_chunk, incremental=incremental)
    elif api == "chat":
        url, body, on_chunk = f"{base_url}/v1/chat/completions", chat_payload(prompt, params, model), _on_chat_chunk
    else:
        url, body, on_chunk = f"{base_url}/v1/completions", completions_payload(prompt, params, model), _on_completions_chunk
    rec = RequestRecord(request_id=request_id, prompt_id=prompt.prompt_id, send_ts=time.perf_counter(),
                        sampling_seed=params.get("sampling_seed"))
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
            else:
                async for chunk in _sse_events(resp):
                    if "error" in chunk:
                        rec.error = f"server error: {json.dumps(chunk['error'])[:500]}"
                        break
                    on_chunk(rec, chunk, time.perf_counter())
                if rec.error is None and rec.finish_reason is None:
                    rec.error = "stream ended without a finish_reason"
    except (aiohttp.ClientError, TimeoutError) as err:
        rec.error = f"{type(err).__name__}: {err}"[:500] or type(err).__name__
    rec.end_ts = time.perf_counter()
    return rec
