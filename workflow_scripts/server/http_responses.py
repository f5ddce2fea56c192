"""What the routes answer, as pydantic models: the OpenAPI document's response schemas.

The routes build plain dicts (the streaming path stays cheap); these models state their shape for clients and
for schemathesis, which checks every response, and every SSE event's JSON, against them. Field names follow
SGLang 0.5.23 (`GenerateReqInput` outputs, `protocol.py` of its OpenAI routes). Extra fields are allowed, as a
newer server may add some.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FinishType = Literal["stop", "length", "abort"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FinishReason(_Open):
    """Why a request ended: its EOS or stop string/token (`matched`), its length, or an abort (`message`)."""

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(_Open):
    id: str
    finish_reason: FinishReason | None = Field(description="null until the request ends")
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str
    e2e_latency: float | None = Field(None, description="seconds; on the last output only")
    spec_verify_ct: int | None = Field(None, description="speculation: verify steps (on the last output)")
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None


class GenerateOutput(_Open):
    """One /generate output; streamed outputs are cumulative (SGLang's default), a batch's carry `index`."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo
    index: int | None = Field(None, description="the prompt's position in a streamed batch")


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishType | None
    matched_stop: int | str | None = None


class CompletionResponse(_Open):
    """A /v1/completions answer, or (object `text_completion` too) one chunk of its stream."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = Field(None, description="streamed: only on the last chunk, with include_usage")


class ChatMessageOut(_Open):
    role: Literal["assistant"]
    content: str
    reasoning_content: None = None
    tool_calls: None = None


class ChatChoice(_Open):
    index: int
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishType | None
    matched_stop: int | str | None = None


class ChatCompletionResponse(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(_Open):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Open):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishType | None
    matched_stop: int | str | None = None


class ChatCompletionChunk(_Open):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(None, description="only on the last chunk, with stream_options.include_usage")


class ErrorDetail(_Open):
    message: str = Field(description="starts with the field at fault")
    type: str
    param: str | None = Field(description="the dotted name of the field at fault, in the request's own terms")
    code: int


class ErrorResponse(_Open):
    """Every 4xx/5xx body: SGLang's error envelope with OpenAI's `param`."""

    error: ErrorDetail


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class ServerInfo(_Open):
    """The resolved server args plus the engine's live counters (`internal_states[0]`) and, ours, the engine
    process's torch setup (`engine_torch`: threads, grad and inference mode, ISA; engine/torch_setup.py)."""

    internal_states: list[dict]
    engine_torch: dict | None = None
    version: str
    startup_time: float


class ModelInfo(_Open):
    model_path: str
    served_model_name: str
    is_generation: bool


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    GenerateOutput, CompletionResponse, ChatCompletionResponse, ChatCompletionChunk, ErrorResponse, ModelCard,
    ModelList, ServerInfo, ModelInfo,
)  # fmt: skip
