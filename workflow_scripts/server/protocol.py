"""The protocol: request bodies of /generate, /v1/completions, /v1/chat/completions and /in_engine_bench as
pydantic models, apart from what the server does with them (request_prep.py), as SGLang keeps `protocol.py`
apart from its `serving_*.py`.

Field names, defaults and range checks follow SGLang (`GenerateReqInput`, `SamplingParams.verify`,
`CompletionRequest`, `ChatCompletionRequest`). Types are strict: a string where a number belongs is refused rather
than coerced. SGLang knobs the embedded engine does not implement are accepted at their neutral value only.

The same models are the OpenAPI document's request schemas (http_openapi.py). Where a check is code rather than a
pydantic constraint (non-empty strings, neutral-only knobs), a `WithJsonSchema` states it, so the document accepts
exactly what the server accepts. Limits of the served model are markers (TOKEN_ID, MAX_TOKENS, PROMPT_IDS) that
the document fills in from the model, as are references between schemas (REF). One rule no JSON Schema can state
stays prose: the prompt's tokens plus max_new_tokens must fit in the context length.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

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


UNSUPPORTED_SAMPLING = (
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

# Chat adds OpenAI's newer name for the output budget; SGLang prefers it over max_tokens when both are given.
CHAT_SAMPLING_FIELDS = {**COMPLETION_SAMPLING_FIELDS, "max_completion_tokens": "max_new_tokens"}


class InEngineBenchIn(BaseModel):
    """A cell of the in-engine bench (`--enable-in-engine-bench`): the prompts run as a closed loop on the engine
    itself, `concurrency` in flight, with one sampling_params for all."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input_ids: Annotated[list[list[int]], _schema({"type": "array", "items": PROMPT_TOKEN_IDS, "minItems": 1})]
    sampling_params: Annotated[dict | None, _schema({"anyOf": [_ref("SamplingParamsIn"), NULL]})] = None
    concurrency: Annotated[int, Field(ge=1)]
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
