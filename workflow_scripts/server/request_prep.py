"""Request preparation: a request body, validated strictly against the protocol's models (protocol.py), turned
into engine requests.

Range checks that need the served model follow SGLang (`TokenizerManager._validate_one_request`): token ids within
the vocabulary, the prompt plus its budget within the context length. Every refusal is a `RequestError` naming the
field in the client's own vocabulary; a knob the embedded engine does not implement is refused unless neutral, so
a client never gets silently different sampling.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from workflow_scripts.engine.types import SamplingParams
from workflow_scripts.server.http_errors import RequestError
from workflow_scripts.server.protocol import (CHAT_SAMPLING_FIELDS, COMPLETION_SAMPLING_FIELDS,
                                              OPENAI_DEFAULT_MAX_TOKENS, UNSUPPORTED_SAMPLING, ChatCompletionIn,
                                              CompletionIn, GenerateIds, GenerateText, InEngineBenchIn,
                                              SamplingParamsIn)
from workflow_scripts.server.server_generate import PreparedRequest

# pydantic puts the member type of a union into the error location; these are not field names.
_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _field_of(loc: Sequence[Any], rename: dict[str, str] | None = None) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p))]
    if rename and parts:
        parts[0] = rename.get(parts[0], parts[0])
    return ".".join(parts) or "body"


def _validate(model: type[BaseModel], data: Any, prefix: str = "", rename: dict[str, str] | None = None):
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = prefix + _field_of(first["loc"], rename)
        raise RequestError(field.rstrip("."), first["msg"]) from None


def _json_number(text: str) -> int | float:
    """JSON (and JSON Schema) do not tell 1.0 from 1: an integral number is an int, so an int field takes it."""
    value = float(text)
    return int(value) if value.is_integer() else value


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object, or a RequestError naming `body`."""
    try:
        body = json.loads(raw, parse_float=_json_number)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError("body", f"not valid JSON ({err})") from None
    if not isinstance(body, dict):
        raise RequestError("body", f"must be a JSON object, got {type(body).__name__}")
    return body


@dataclass(frozen=True)
class ModelLimits:
    """What validation needs to know about the served model."""

    vocab_size: int
    context_length: int
    encode: Callable[[str], list[int]]
    # the prompt text of a conversation (the model's chat template); None when the model has no template
    chat_prompt: Callable[[list[dict]], str] | None = None


def _refuse_unless_default(model: BaseModel, names: Sequence[str], prefix: str, rename: dict[str, str]) -> None:
    for name in names:
        default = type(model).model_fields[name].default
        if getattr(model, name) != default:
            field = prefix + rename.get(name, name)
            raise RequestError(field, f"is not supported by the embedded engine (only {json.dumps(default)})")


def _sampling(raw: Any, prefix: str, rename: dict[str, str]) -> SamplingParamsIn:
    if not isinstance(raw, dict):
        raise RequestError(prefix.rstrip("."), "must be a JSON object")
    sp = _validate(SamplingParamsIn, raw, prefix, rename)
    _refuse_unless_default(sp, UNSUPPORTED_SAMPLING, prefix, rename)
    return sp


def _prepare_one(
    input_ids: list[int],
    sp: SamplingParamsIn,
    limits: ModelLimits,
    prompt_field: str,
    sp_prefix: str,
    rename: dict[str, str],
    rid: str | None,
    log_metrics: bool = True,
) -> PreparedRequest:
    if not input_ids:
        raise RequestError(prompt_field, "is empty")
    bad = next((t for t in input_ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise RequestError(prompt_field, f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})")
    for token in sp.stop_token_ids or ():
        if not 0 <= token < limits.vocab_size:
            field = sp_prefix + rename.get("stop_token_ids", "stop_token_ids")
            raise RequestError(field, f"token id {token} is outside the vocabulary [0, {limits.vocab_size})")
    if len(input_ids) >= limits.context_length:
        raise RequestError(
            prompt_field,
            f"the input ({len(input_ids)} tokens) is longer than the model's context length "
            f"({limits.context_length} tokens)",
        )
    room = limits.context_length - len(input_ids)
    max_new = room if sp.max_new_tokens is None else sp.max_new_tokens
    if max_new > room:
        raise RequestError(
            sp_prefix + rename.get("max_new_tokens", "max_new_tokens"),
            f"requested {len(input_ids)} input + {max_new} new tokens, more than the model's context length "
            f"of {limits.context_length} tokens",
        )
    stop = (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ())
    params = SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        max_new_tokens=max_new,
        ignore_eos=sp.ignore_eos,
        stop_token_ids=tuple(sp.stop_token_ids or ()),
        sampling_seed=sp.sampling_seed,
    )
    extra = {"rid": rid} if rid is not None else {}
    return PreparedRequest(
        input_ids=list(input_ids),
        params=params,
        stop_strs=stop,
        no_stop_trim=sp.no_stop_trim,
        skip_special_tokens=sp.skip_special_tokens,
        stream_interval=sp.stream_interval,
        log_metrics=log_metrics,
        **extra,
    )


def _as_batch(value: Any, n: int, field: str) -> list:
    """A per-request field given once for the batch, or once per request."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(field, f"has {len(value)} entries for a batch of {n} prompts")
        return value
    return [value] * n


def _encode(texts: list[str], field: str, is_batch: bool, limits: ModelLimits) -> list[list[int]]:
    for i, text in enumerate(texts):
        if not text:
            raise RequestError(f"{field}.{i}" if is_batch else field, "is empty")
    return [limits.encode(t) for t in texts]


def prepare_generate(body: dict, limits: ModelLimits) -> tuple[list[PreparedRequest], bool, bool]:
    """(requests, stream, is_batch) for a /generate body."""
    req = _validate(GenerateIds if body.get("input_ids") is not None else GenerateText, body)
    for name in ("return_hidden_states", "return_routed_experts", "return_text_in_logprobs"):
        if getattr(req, name):
            raise RequestError(name, "is not supported by the embedded engine")
    if req.return_logprob is True or (isinstance(req.return_logprob, list) and any(req.return_logprob)):
        raise RequestError("return_logprob", "is not supported by the embedded engine")
    for name in ("lora_path", "image_data", "video_data", "audio_data", "input_embeds"):
        if getattr(req, name) is not None:
            raise RequestError(name, "is not supported by the embedded engine")
    if isinstance(req, GenerateText):
        is_batch = isinstance(req.text, list)
        prompt_field = "text"
        prompts = _encode(req.text if is_batch else [req.text], "text", is_batch, limits)
    else:
        is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompt_field = "input_ids"
        prompts = req.input_ids if is_batch else [req.input_ids]
    if is_batch and not prompts:
        raise RequestError(prompt_field, "is an empty batch")
    n = len(prompts)
    sampling = _as_batch(req.sampling_params if req.sampling_params is not None else {}, n, "sampling_params")
    rids = _as_batch(req.rid, n, "rid")
    prepared = []
    for i, (ids, raw_sp, rid) in enumerate(zip(prompts, sampling, rids, strict=True)):
        field = f"{prompt_field}.{i}" if is_batch else prompt_field
        sp_prefix = f"sampling_params.{i}." if isinstance(req.sampling_params, list) else "sampling_params."
        sp = _sampling(raw_sp, sp_prefix, {})
        prepared.append(_prepare_one(ids, sp, limits, field, sp_prefix, {}, rid, req.log_metrics))
    return prepared, req.stream, is_batch


def _openai_sampling(
    body: dict, fields: dict[str, str], default_max_tokens: int | None
) -> tuple[SamplingParamsIn, dict[str, str]]:
    """The sampling params of an OpenAI body (its top-level fields), and the internal -> OpenAI name map that
    errors use. Of two OpenAI names for one internal field, the one later in `fields` wins unless it is null."""
    raw_sp: dict[str, Any] = {"max_new_tokens": default_max_tokens}
    back: dict[str, str] = {}
    given: set[str] = set()
    for name, internal in fields.items():
        back.setdefault(internal, name)
        if name in body and (body[name] is not None or internal not in given):
            raw_sp[internal], back[internal] = body[name], name
            given.add(internal)
    return _sampling(raw_sp, "", back), back


def prepare_completion(body: dict, limits: ModelLimits) -> tuple[list[PreparedRequest], CompletionIn]:
    """(requests, parsed body) for a /v1/completions body."""
    req = _validate(CompletionIn, body)
    if req.best_of not in (None, 1):
        raise RequestError("best_of", "is not supported by the embedded engine (only 1)")
    for name, neutral in (("echo", False), ("logprobs", None), ("suffix", None), ("lora_path", None)):
        if getattr(req, name) != neutral:
            raise RequestError(name, f"is not supported by the embedded engine (only {json.dumps(neutral)})")
    sp, back = _openai_sampling(body, COMPLETION_SAMPLING_FIELDS, OPENAI_DEFAULT_MAX_TOKENS)
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts, is_batch = _encode([prompt], "prompt", False, limits), False
    elif prompt and isinstance(prompt[0], str):
        prompts, is_batch = _encode(prompt, "prompt", True, limits), True
    elif prompt and isinstance(prompt[0], list):
        prompts, is_batch = prompt, True
    else:
        prompts, is_batch = [prompt], False
    prepared = [
        _prepare_one(ids, sp, limits, f"prompt.{i}" if is_batch else "prompt", "", back, None)
        for i, ids in enumerate(prompts)
    ]
    return prepared, req


def prepare_chat(body: dict, limits: ModelLimits) -> tuple[PreparedRequest, ChatCompletionIn]:
    """(request, parsed body) for a /v1/chat/completions body: the messages rendered by the chat template."""
    req = _validate(ChatCompletionIn, body)
    if limits.chat_prompt is None:
        raise RequestError("messages", "the served model has no chat template (tokenizer_config.json chat_template)")
    if req.logprobs:
        raise RequestError("logprobs", "is not supported by the embedded engine (only false)")
    for name in ("top_logprobs", "tools", "response_format"):
        if getattr(req, name) is not None:
            raise RequestError(name, "is not supported by the embedded engine (only null)")
    sp, back = _openai_sampling(body, CHAT_SAMPLING_FIELDS, None)
    try:
        text = limits.chat_prompt([{"role": m.role, "content": m.text()} for m in req.messages])
    except ValueError as err:  # the template refused the conversation
        raise RequestError("messages", str(err)) from None
    return _prepare_one(limits.encode(text), sp, limits, "messages", "", back, None), req


def prepare_in_engine_bench(body: dict, limits: ModelLimits) -> tuple[list[list[int]], list[SamplingParams], int,
                                                                       float]:
    """(prompts, their engine params, concurrency, timeout) for an /in_engine_bench body."""
    req = _validate(InEngineBenchIn, body)
    if not req.input_ids:
        raise RequestError("input_ids", "is an empty batch")
    sp = _sampling(req.sampling_params if req.sampling_params is not None else {}, "sampling_params.", {})
    if sp.stop:
        raise RequestError("sampling_params.stop", "stop strings are the front's; the in-engine bench has none")
    prepared = [_prepare_one(ids, sp, limits, f"input_ids.{i}", "sampling_params.", {}, None)
                for i, ids in enumerate(req.input_ids)]
    return [r.input_ids for r in prepared], [r.params for r in prepared], req.concurrency, req.timeout_s
