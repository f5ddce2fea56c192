"""Request bodies of /generate, /v1/completions and /v1/chat/completions, validated strictly, turned into engine
requests.

Field names, defaults and range checks follow SGLang (`GenerateReqInput`, `SamplingParams.verify`,
`CompletionRequest`, `ChatCompletionRequest`, `TokenizerManager._validate_one_request`). Types are strict: a string
where a number belongs is refused rather than coerced. SGLang knobs the embedded engine does not implement are
accepted at their neutral value and refused otherwise, so a client never gets silently different sampling.
Every refusal is a `RequestError` naming the field in the client's own vocabulary.

The same pydantic models are the OpenAPI document's request schemas (http_openapi.py). Where a check is code
rather than a pydantic constraint (non-empty strings, neutral-only knobs), a `WithJsonSchema` states it, so the
document accepts exactly what the server accepts. Limits of the served model are markers (TOKEN_ID, MAX_TOKENS,
PROMPT_IDS) that the document fills in from the model, as are references between schemas (REF). One rule no JSON Schema can state stays prose: the prompt's
tokens plus max_new_tokens must fit in the context length.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from workflow_scripts.server.http_errors import RequestError
from workflow_scripts.server.server_generate import PreparedRequest
from workflow_scripts.engine.types import SamplingParams

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


# Markers in the request schemas, replaced by the served model's limits when the OpenAPI document is built.
TOKEN_ID = "x-token-id"  # an integer token id: maximum = vocab_size - 1
MAX_TOKENS = "x-max-tokens"  # a token budget: maximum = context_length - 1
PROMPT_IDS = "x-prompt-ids"  # a prompt as ids: maxItems = context_length - 1
NULL = {"type": "null"}
NON_EMPTY_STR = {"type": "string", "minLength": 1}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, TOKEN_ID: True}}
PROMPT_TOKEN_IDS = {**TOKEN_IDS, "minItems": 1, PROMPT_IDS: True}


def _schema(schema: dict, description: str | None = None) -> WithJsonSchema:
    return WithJsonSchema({**schema, "description": description} if description else schema)


def _const(value: Any) -> dict:
    """JSON Schema's const compares numbers by value (1.0 matches 1); an int field is strict about its type."""
    if value is None:
        return NULL
    return {"const": value, "type": "integer"} if type(value) is int else {"const": value}


def _only(value: Any) -> WithJsonSchema:
    """Documents a knob the embedded engine accepts only at its neutral value."""
    return _schema(_const(value), f"not supported by the embedded engine: only {json.dumps(value)}")


class SamplingParamsIn(BaseModel):
    """SGLang's `sampling_params`. Unknown keys are refused, as SGLang's `SamplingParams(**d)` refuses them."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_new_tokens: Annotated[int | None, _schema(
        {"anyOf": [{"type": "integer", "minimum": 0, MAX_TOKENS: True}, NULL]},
        "null: up to the context length; prompt tokens + max_new_tokens must fit in the context length",
    )] = Field(128, ge=0)
    stop: Annotated[str | list[str] | None, _schema(
        {"anyOf": [NON_EMPTY_STR, {"type": "array", "items": NON_EMPTY_STR}, NULL]})] = None
    stop_token_ids: Annotated[list[int] | None, _schema({"anyOf": [TOKEN_IDS, NULL]})] = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Annotated[int, _schema({"anyOf": [_const(-1), {"type": "integer", "minimum": 1}]},
                                  "-1 disables top-k")] = -1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = Field(None, ge=1)
    sampling_seed: Annotated[int | None, _schema(
        {"anyOf": [{"type": "integer"}, NULL]},
        "the request's own random stream: the same seed, prompt and parameters sample the same tokens whatever "
        "else the server runs (SGLang honours it under --enable-deterministic-inference)",
    )] = None
    # Implemented by SGLang, not by the embedded engine: only the neutral value is accepted.
    min_p: Annotated[float, _only(0.0)] = 0.0
    frequency_penalty: Annotated[float, _only(0.0)] = 0.0
    presence_penalty: Annotated[float, _only(0.0)] = 0.0
    repetition_penalty: Annotated[float, _only(1.0)] = 1.0
    min_new_tokens: Annotated[int, _only(0)] = 0
    n: Annotated[int, _only(1)] = 1
    json_schema: Annotated[str | None, _only(None)] = None
    regex: Annotated[str | None, _only(None)] = None
    ebnf: Annotated[str | None, _only(None)] = None
    structural_tag: Annotated[str | None, _only(None)] = None
    stop_regex: Annotated[str | list[str] | None, _only(None)] = None
    logit_bias: Annotated[dict[str, float] | None, _only(None)] = None
    custom_params: Annotated[dict[str, Any] | None, _only(None)] = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value < 1 and value != -1:
            raise ValueError("top_k must be -1 (disabled) or at least 1")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value == "" or (isinstance(value, list) and "" in value):
            raise ValueError("stop strings must be non-empty")
        return value


_UNSUPPORTED_SAMPLING = (
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "stop_regex", "logit_bias", "custom_params",
)  # fmt: skip


REF = "x-ref"  # marker: a reference to another model's schema (pydantic resolves a literal $ref itself)


def _ref(name: str) -> dict:
    return {REF: name}


class GenerateBase(BaseModel):
    """SGLang's `GenerateReqInput` (the fields this server reads or must refuse; other fields are ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    sampling_params: Annotated[dict | list[dict] | None, _schema(
        {"anyOf": [_ref("SamplingParamsIn"), {"type": "array", "items": _ref("SamplingParamsIn")}, NULL]},
        "one for every prompt, or a list with one per prompt of a batch")] = None
    rid: Annotated[str | list[str] | None, _schema(
        {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "uniqueItems": True}, NULL]},
        "request id (one per prompt of a batch); must not be in flight already")] = None
    stream: bool = False
    return_logprob: Annotated[bool | list[bool] | None, _schema(
        {"anyOf": [{"const": False}, {"type": "array", "items": {"const": False}}, NULL]},
        "not supported by the embedded engine: only false")] = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: Annotated[bool, _only(False)] = False
    return_hidden_states: Annotated[bool, _only(False)] = False
    return_routed_experts: Annotated[bool, _only(False)] = False
    log_metrics: bool = True
    lora_path: Annotated[str | list[str | None] | None, _only(None)] = None
    image_data: Annotated[Any, _only(None)] = None
    video_data: Annotated[Any, _only(None)] = None
    audio_data: Annotated[Any, _only(None)] = None
    input_embeds: Annotated[Any, _only(None)] = None


class GenerateText(GenerateBase):
    """A /generate request whose prompt is text (one string, or a batch of strings)."""

    text: Annotated[str | list[str], _schema(
        {"anyOf": [NON_EMPTY_STR, {"type": "array", "items": NON_EMPTY_STR, "minItems": 1}]})]
    input_ids: Annotated[None, _schema(NULL, "give exactly one of text or input_ids")] = None


class GenerateIds(GenerateBase):
    """A /generate request whose prompt is token ids (one list, or a batch of lists)."""

    input_ids: Annotated[list[int] | list[list[int]], _schema(
        {"anyOf": [PROMPT_TOKEN_IDS, {"type": "array", "items": PROMPT_TOKEN_IDS, "minItems": 1}]})]
    text: Annotated[None, _schema(NULL, "give exactly one of text or input_ids")] = None


class StreamOptionsIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionIn(BaseModel):
    """OpenAI `/v1/completions` fields other than sampling ones (those go through SamplingParamsIn)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str = "default"
    prompt: Annotated[str | list[int] | list[str] | list[list[int]], _schema({"anyOf": [
        NON_EMPTY_STR, PROMPT_TOKEN_IDS, {"type": "array", "items": NON_EMPTY_STR, "minItems": 1},
        {"type": "array", "items": PROMPT_TOKEN_IDS, "minItems": 1},
    ]})]
    best_of: Annotated[int | None, _schema({"anyOf": [_const(1), NULL]},
                                           "not supported by the embedded engine: only 1")] = None
    echo: Annotated[bool, _only(False)] = False
    logprobs: Annotated[int | None, _only(None)] = None
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    suffix: Annotated[str | None, _only(None)] = None
    user: str | None = None
    lora_path: Annotated[str | None, _only(None)] = None


class ChatContentPart(BaseModel):
    """A text part of a message's content (the models take no images or audio)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str | list[ChatContentPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionIn(BaseModel):
    """OpenAI `/v1/chat/completions` fields other than sampling ones (those go through SamplingParamsIn)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str = "default"
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    user: str | None = None
    logprobs: Annotated[bool | None, _schema({"anyOf": [{"const": False}, NULL]},
                                             "not supported by the embedded engine: only false")] = None
    top_logprobs: Annotated[int | None, _only(None)] = None
    tools: Annotated[list[Any] | None, _only(None)] = None
    response_format: Annotated[dict[str, Any] | None, _only(None)] = None


# OpenAI completion field -> SGLang sampling_params key (SGLang's `_convert_to_internal_request`).
COMPLETION_SAMPLING_FIELDS = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "seed": "sampling_seed",
    **{
        name: name
        for name in (
            "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "no_stop_trim",
            "skip_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "n",
            "json_schema", "regex", "ebnf",
        )
    },
}  # fmt: skip
OPENAI_DEFAULT_MAX_TOKENS = 16  # /v1/completions; chat has none: it runs to EOS or the context length, as SGLang


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
    _refuse_unless_default(sp, _UNSUPPORTED_SAMPLING, prefix, rename)
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


# Chat adds OpenAI's newer name for the output budget; SGLang prefers it over max_tokens when both are given.
CHAT_SAMPLING_FIELDS = {**COMPLETION_SAMPLING_FIELDS, "max_completion_tokens": "max_new_tokens"}


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


class InEngineBenchIn(BaseModel):
    """A cell of the in-engine bench (`--enable-in-engine-bench`): the prompts run as a closed loop on the engine
    itself, `concurrency` in flight, with one sampling_params for all."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input_ids: Annotated[list[list[int]], _schema({"type": "array", "items": PROMPT_TOKEN_IDS, "minItems": 1})]
    sampling_params: Annotated[dict | None, _schema({"anyOf": [_ref("SamplingParamsIn"), NULL]})] = None
    concurrency: Annotated[int, Field(ge=1)]
    timeout_s: Annotated[float, Field(gt=0)] = 600.0


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
