"""The OpenAPI document at /openapi.json: every route's request body and responses (200 JSON, SSE streams, 4xx).

The routes read their bodies themselves (strict parsing, errors naming the field: request_prep.py), so FastAPI
cannot infer the bodies; each route declares them with `openapi_extra=operation(...)`, pointing at the pydantic
models of protocol.py and http_responses.py, whose schemas `build_openapi` adds under components. The served
model's limits (vocabulary, context length) are filled in there, so the document states exactly what this
server accepts. A streamed 200 is `text/event-stream`: each event's `data` is the JSON of one chunk (its schema
given as `contentSchema`), or the closing `[DONE]`.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from workflow_scripts.server.auth import OPEN_PREFIXES
from workflow_scripts.server.http_responses import RESPONSE_MODELS
from workflow_scripts.server.protocol import (
    CHAT_SAMPLING_FIELDS,
    COMPLETION_SAMPLING_FIELDS,
    MAX_TOKENS,
    OPENAI_DEFAULT_MAX_TOKENS,
    PROMPT_IDS,
    REF,
    TOKEN_ID,
    ChatCompletionIn,
    CompletionIn,
    GenerateIds,
    GenerateText,
    InEngineBenchIn,
    SamplingParamsIn,
)
from workflow_scripts.server.request_prep import ModelLimits

REF_TEMPLATE = "#/components/schemas/{model}"


def ref(name: str) -> dict:
    return {"$ref": REF_TEMPLATE.format(model=name)}


def sse(chunk: str) -> dict:
    """An event stream whose events carry the JSON of `chunk`, then `[DONE]`."""
    data = {"type": "string", "if": {"const": "[DONE]"},
            "else": {"contentMediaType": "application/json", "contentSchema": ref(chunk)}}
    return {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}


def _error(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": ref("ErrorResponse")}}}


def operation(
    ok: dict[str, Any], *, body: str | None = None, stream: str | None = None, not_found: bool = False,
    unavailable: bool = False,
) -> dict:
    """`openapi_extra` for one route: its JSON body (a components schema name), its 200 content (media type ->
    schema; none for an empty 200), the chunk schema of its SSE stream, and its error responses."""
    content = {media: {"schema": schema} for media, schema in ok.items()}
    if stream:
        content["text/event-stream"] = sse(stream)
    ok_response = {"description": "OK", "content": content} if content else {"description": "OK"}
    responses: dict[str, Any] = {"200": ok_response, "500": _error("internal error (the server stays up)")}
    if body:
        responses["400"] = _error("refused: `error.param` names the field at fault")
        responses["503"] = _error("the engine process is gone (the server exits)")
    if not_found:
        responses["404"] = _error("no such model")
    if unavailable:
        responses["503"] = {"description": "not ready yet, or the engine produced nothing in time"}
    out: dict[str, Any] = {"responses": responses}
    if body:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(body)}}}
    return out


def _model_schemas(models: tuple[type[BaseModel], ...]) -> dict[str, dict]:
    schemas: dict[str, dict] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF_TEMPLATE)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _openai_request(schemas: dict, model: type[BaseModel], fields: dict[str, str], default_max: int | None) -> dict:
    """An OpenAI request's schema: the model's own fields plus the sampling fields it takes at the top level."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    schemas.update(schema.pop("$defs", {}))
    sampling = SamplingParamsIn.model_json_schema(ref_template=REF_TEMPLATE)["properties"]
    for name, internal in fields.items():
        prop = copy.deepcopy(sampling[internal])
        if internal == "max_new_tokens":
            prop["default"] = default_max
        schema["properties"][name] = prop
    return schema


def _fill_limits(node: Any, limits: ModelLimits) -> None:
    """Replace the markers of protocol.py by this model's vocabulary and context length, and by `$ref`s,
    in place."""
    if isinstance(node, dict):
        if REF in node:
            node["$ref"] = REF_TEMPLATE.format(model=node.pop(REF))
        if node.pop(TOKEN_ID, False):
            node["maximum"] = limits.vocab_size - 1
        if node.pop(MAX_TOKENS, False):
            node["maximum"] = limits.context_length - 1
        if node.pop(PROMPT_IDS, False):
            node["maxItems"] = limits.context_length - 1
        for value in node.values():
            _fill_limits(value, limits)
    elif isinstance(node, list):
        for value in node:
            _fill_limits(value, limits)


def _require_bearer(doc: dict) -> None:
    """--api-key: every route but the supervisor's (auth.OPEN_PREFIXES) needs `Authorization: Bearer KEY`."""
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in doc["paths"].items():
        if path.startswith(OPEN_PREFIXES):
            continue
        for op in item.values():
            op["security"] = [{"bearer": []}]
            op["responses"]["401"] = _error("no or a wrong API key")


def build_openapi(app: FastAPI, limits: ModelLimits, api_key: bool) -> dict:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(_model_schemas((SamplingParamsIn, GenerateText, GenerateIds, InEngineBenchIn, *RESPONSE_MODELS)))
    schemas["GenerateReqInput"] = {"anyOf": [ref("GenerateText"), ref("GenerateIds")],
                                   "description": "give exactly one of text or input_ids"}
    schemas["CompletionRequest"] = _openai_request(schemas, CompletionIn, COMPLETION_SAMPLING_FIELDS,
                                                   OPENAI_DEFAULT_MAX_TOKENS)
    schemas["ChatCompletionRequest"] = _openai_request(schemas, ChatCompletionIn, CHAT_SAMPLING_FIELDS, None)
    _fill_limits(doc, limits)
    if api_key:
        _require_bearer(doc)
    return doc
