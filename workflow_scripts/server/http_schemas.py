"""Request bodies of /generate and /v1/completions, validated strictly, turned into engine requests.

Field names, defaults and range checks follow SGLang (`GenerateReqInput`, `SamplingParams.verify`,
`CompletionRequest`, `TokenizerManager._validate_one_request`). Types are strict: a string where a number
belongs is refused rather than coerced. SGLang knobs the embedded engine does not implement are accepted at
their neutral value and refused otherwise, so a client never gets silently different sampling.
Every refusal is a `RequestError` naming the field in the client's own vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object, or a RequestError naming `body`."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError("body", f"not valid JSON ({err})") from None
    if not isinstance(body, dict):
        raise RequestError("body", f"must be a JSON object, got {type(body).__name__}")
    return body


class SamplingParamsIn(BaseModel):
    """SGLang's `sampling_params`. Unknown keys are refused, as SGLang's `SamplingParams(**d)` refuses them."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_new_tokens: int | None = Field(128, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = Field(None, ge=1)
    # Implemented by SGLang, not by the embedded engine: only the neutral value is accepted.
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stop_regex: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None
    custom_params: dict[str, Any] | None = None

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
    "regex", "ebnf", "structural_tag", "stop_regex", "logit_bias", "sampling_seed", "custom_params",
)  # fmt: skip


class GenerateIn(BaseModel):
    """SGLang's `GenerateReqInput` (the fields this server reads or must refuse; other fields are ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict | list[dict] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    log_metrics: bool = True
    lora_path: str | list[str | None] | None = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None


class StreamOptionsIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionIn(BaseModel):
    """OpenAI `/v1/completions` fields other than sampling ones (those go through SamplingParamsIn)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str = "default"
    prompt: str | list[int] | list[str] | list[list[int]]
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    suffix: str | None = None
    user: str | None = None
    lora_path: str | None = None


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
OPENAI_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class ModelLimits:
    """What validation needs to know about the served model."""

    vocab_size: int
    context_length: int
    encode: Callable[[str], list[int]]


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
    req = _validate(GenerateIn, body)
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("text", "give exactly one of text or input_ids")
    for name in ("return_hidden_states", "return_routed_experts", "return_text_in_logprobs"):
        if getattr(req, name):
            raise RequestError(name, "is not supported by the embedded engine")
    if req.return_logprob is True or (isinstance(req.return_logprob, list) and any(req.return_logprob)):
        raise RequestError("return_logprob", "is not supported by the embedded engine")
    for name in ("lora_path", "image_data", "video_data", "audio_data", "input_embeds"):
        if getattr(req, name) is not None:
            raise RequestError(name, "is not supported by the embedded engine")
    if req.text is not None:
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


def prepare_completion(body: dict, limits: ModelLimits) -> tuple[list[PreparedRequest], CompletionIn]:
    """(requests, parsed body) for a /v1/completions body."""
    req = _validate(CompletionIn, body)
    if req.best_of not in (None, 1):
        raise RequestError("best_of", "is not supported by the embedded engine (only 1)")
    for name, neutral in (("echo", False), ("logprobs", None), ("suffix", None), ("lora_path", None)):
        if getattr(req, name) != neutral:
            raise RequestError(name, f"is not supported by the embedded engine (only {json.dumps(neutral)})")
    raw_sp = {internal: body[name] for name, internal in COMPLETION_SAMPLING_FIELDS.items() if name in body}
    raw_sp.setdefault("max_new_tokens", OPENAI_DEFAULT_MAX_TOKENS)
    back = {internal: name for name, internal in COMPLETION_SAMPLING_FIELDS.items()}
    sp = _sampling(raw_sp, "", back)
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
