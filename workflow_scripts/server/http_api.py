"""SGLang's HTTP API over the embedded engine: same paths, payloads and field names.

Checked against SGLang 0.5.23 (`srt/entrypoints/http_server.py`, `openai/serving_completions.py`,
`benchmark/serving.py`): /generate streams cumulative `text` and `output_ids` (SGLang's default), or only the
new ones with `--incremental-streaming-output`, as SSE `data:` lines ending in `data: [DONE]`; /v1/completions
and /v1/chat/completions stream OpenAI deltas; /server_info carries `internal_states[0].avg_spec_accept_length`.
Every route declares its body and responses in /openapi.json (http_openapi.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from workflow_scripts.server.engine_client import EngineClient, EngineDied
from workflow_scripts.server.auth import ApiKeyMiddleware
from workflow_scripts.server.http_errors import RequestError, error_body, error_response
from workflow_scripts.server.metrics import CONTENT_TYPE
from workflow_scripts.server.http_openai import ChatShaper, CompletionShaper
from workflow_scripts.server.http_openapi import build_openapi, operation, ref
from workflow_scripts.server.request_prep import (
    ModelLimits,
    parse_json_object,
    prepare_chat,
    prepare_completion,
    prepare_generate,
    prepare_in_engine_bench,
)
from workflow_scripts.server.server_generate import Generator, PreparedRequest
from workflow_scripts.engine.types import SamplingParams

log = logging.getLogger(__name__)

SERVER_VERSION = "0.1.0-embedded"
HEALTH_CHECK_TIMEOUT_S = 20.0


@dataclass
class ServerState:
    """What the routes share: the engine bridge, model limits, the args to report, and readiness."""

    generator: Generator
    limits: ModelLimits
    server_info: dict  # resolved server args, reported by /server_info
    model_info: dict
    engine: EngineClient
    incremental_streaming: bool = False  # --incremental-streaming-output: /generate streams deltas
    api_key: str | None = None  # --api-key
    in_engine_bench: bool = False  # --enable-in-engine-bench: serve POST /in_engine_bench
    ready: bool = False  # set after the warm-up request; /health* answer 503 until then (and once the engine died)
    startup_time: float = field(default_factory=time.time)


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def _json_body(request: Request) -> dict:
    return parse_json_object(await request.body())


async def _first_then_rest(
    outputs: AsyncIterator[dict], render: Callable[[dict], list[bytes]], tail: Callable[[], list[bytes]]
) -> StreamingResponse | Response:
    """Start the SSE response only once the first output exists, so an engine refusal is still a 4xx."""
    try:
        first = await anext(outputs)
    except StopAsyncIteration:  # the client went away before any token
        return Response(status_code=499)
    except RequestError:
        raise
    except ValueError as err:  # the engine refused it; its messages start with the field name
        raise _engine_refusal(err) from None
    except EngineDied as err:
        raise _engine_gone(err) from None

    async def body() -> AsyncIterator[bytes]:
        try:
            for chunk in render(first):
                yield chunk
            async for output in outputs:
                for chunk in render(output):
                    yield chunk
            for chunk in tail():
                yield chunk
        except EngineDied as err:  # SGLang's in-stream error: an `error` chunk, then [DONE]
            log.error("stream ended by engine death: %s", err)
            yield sse(error_body(str(err), None, 503))
        finally:
            await outputs.aclose()
        yield sse("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream")


def _engine_gone(err: EngineDied) -> RequestError:
    return RequestError("engine", str(err), status_code=503)


def _engine_refusal(err: ValueError) -> RequestError:
    field, sep, message = str(err).partition(": ")
    return RequestError(field, message) if sep else RequestError("body", str(err))


async def _final(gen: Generator, reqs: list[PreparedRequest], request: Request) -> list[dict] | None:
    try:
        return await gen.final(reqs, request.is_disconnected)
    except RequestError:
        raise
    except ValueError as err:
        raise _engine_refusal(err) from None
    except EngineDied as err:
        raise _engine_gone(err) from None


async def _openai_route(
    gen: Generator, reqs: list[PreparedRequest], body, shaper: CompletionShaper, request: Request
) -> Response:
    """The answer of /v1/completions or /v1/chat/completions: one JSON object, or the SSE stream of chunks."""
    if not body.stream:
        results = await _final(gen, reqs, request)
        if results is None:
            return Response(status_code=499)
        return JSONResponse(shaper.response(results))

    def tail() -> list[bytes]:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return [sse(shaper.usage_chunk())] if include_usage else []

    outputs = gen.merged_outputs(reqs, request.is_disconnected)
    return await _first_then_rest(outputs, lambda out: [sse(chunk) for chunk in shaper.chunks(out)], tail)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="specstudy embedded engine (SGLang API)", version=SERVER_VERSION)
    if state.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=state.api_key)

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, state.limits, api_key=state.api_key is not None)
        return app.openapi_schema

    app.openapi = openapi
    gen = state.generator
    json_ = "application/json"

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, err: RequestError) -> JSONResponse:
        log.info("refused request: %s", err)
        return error_response(err)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, err: Exception) -> JSONResponse:
        log.exception("internal error")
        return JSONResponse(error_body(f"internal error: {err!r}", None, 500), status_code=500)

    generate_ok = {"anyOf": [ref("GenerateOutput"), {"type": "array", "items": ref("GenerateOutput")}]}

    @app.api_route("/generate", methods=["POST", "PUT"],
                   openapi_extra=operation({json_: generate_ok}, body="GenerateReqInput", stream="GenerateOutput"))
    async def generate(request: Request) -> Response:
        reqs, stream, is_batch = prepare_generate(await _json_body(request), state.limits)
        if stream:
            outputs = gen.merged_outputs(reqs, request.is_disconnected, state.incremental_streaming)
            return await _first_then_rest(outputs, lambda out: [sse(out)], list)
        results = await _final(gen, reqs, request)
        if results is None:
            return Response(status_code=499)
        return JSONResponse(results if is_batch else results[0])

    @app.post("/v1/completions", openapi_extra=operation(
        {json_: ref("CompletionResponse")}, body="CompletionRequest", stream="CompletionResponse"))
    async def completions(request: Request) -> Response:
        reqs, body = prepare_completion(await _json_body(request), state.limits)
        return await _openai_route(gen, reqs, body, CompletionShaper(body.model), request)

    @app.post("/v1/chat/completions", openapi_extra=operation(
        {json_: ref("ChatCompletionResponse")}, body="ChatCompletionRequest", stream="ChatCompletionChunk"))
    async def chat_completions(request: Request) -> Response:
        req, body = prepare_chat(await _json_body(request), state.limits)
        return await _openai_route(gen, [req], body, ChatShaper(body.model), request)

    @app.get("/v1/models", openapi_extra=operation({json_: ref("ModelList")}))
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model:path}", openapi_extra=operation({json_: ref("ModelCard")}, not_found=True))
    async def model(model: str) -> Response:
        card = _model_card(state)
        if model != card["id"]:
            raise RequestError("model", f"{model!r} is not served here (serving {card['id']!r})", status_code=404)
        return JSONResponse(card)

    @app.get("/health", response_class=Response, openapi_extra=operation({}, unavailable=True))
    async def health() -> Response:
        return Response(status_code=200 if state.ready and not state.engine.dead else 503)

    @app.get("/health_generate", response_class=Response, openapi_extra=operation({}, unavailable=True))
    async def health_generate() -> Response:
        if not state.ready or state.engine.dead:
            return Response(status_code=503)
        ok = await _one_token(gen)
        return Response(status_code=200 if ok else 503)

    @app.get("/server_info", openapi_extra=operation({json_: ref("ServerInfo")}))
    @app.get("/get_server_info", openapi_extra=operation({json_: ref("ServerInfo")}))
    async def server_info() -> dict:
        return {
            **state.server_info,
            "startup_time": state.startup_time,
            "internal_states": [await _engine_stats(state.engine)],
            "version": SERVER_VERSION,
            "frontend": "python",
        }

    @app.get("/model_info", openapi_extra=operation({json_: ref("ModelInfo")}))
    @app.get("/get_model_info", openapi_extra=operation({json_: ref("ModelInfo")}))
    async def model_info() -> dict:
        return state.model_info

    if gen.metrics is not None:

        @app.get("/metrics", openapi_extra=operation({"text/plain": {"type": "string"}}))
        async def metrics() -> Response:
            stats = await _engine_stats(state.engine)
            return Response(content=gen.metrics.render(stats), media_type=CONTENT_TYPE)

    if state.in_engine_bench:

        @app.post("/in_engine_bench", openapi_extra=operation({json_: {"type": "object"}}, body="InEngineBenchIn",
                                                              unavailable=True))
        async def in_engine_bench(request: Request) -> dict:
            """A closed-loop cell on this server's own engine, driven from its process: what the same engine does
            with no HTTP, front or client per request, so HTTP ÷ this is the server's cost alone."""
            prompts, params, concurrency, timeout_s = prepare_in_engine_bench(await _json_body(request), state.limits)
            try:
                result = await state.engine.closed_loop(prompts, params, concurrency, timeout_s)
            except EngineDied as err:
                raise _engine_gone(err) from None
            if "error" in result:
                if result.get("internal"):  # the catch-all handler answers 500 with it
                    raise RuntimeError(result["error"])
                if result["timed_out"]:
                    raise RequestError("timeout_s", result["error"], status_code=504)
                raise _engine_refusal(ValueError(result["error"]))
            return result

    @app.api_route("/flush_cache", methods=["GET", "POST"],
                   openapi_extra=operation({"text/plain": {"type": "string"}}))
    async def flush_cache() -> Response:
        # The engine keeps no prefix cache across requests, so there is nothing to flush.
        return Response(content="Cache flushed.\n", status_code=200, media_type="text/plain")

    return app


def _model_card(state: ServerState) -> dict:
    return {
        "id": state.model_info["served_model_name"],
        "object": "model",
        "created": int(state.startup_time),
        "owned_by": "sglang",
        "root": state.model_info["model_path"],
        "max_model_len": state.limits.context_length,
    }


async def _engine_stats(engine: EngineClient) -> dict:
    try:
        return await engine.stats()
    except EngineDied as err:
        raise _engine_gone(err) from None


async def _one_token(gen: Generator) -> bool:
    """SGLang's health check: send a one-token greedy request; the engine is healthy once it emits anything.

    A busy engine may hold the probe in its queue, but its other requests' tokens prove it alive (SGLang's
    `last_receive_tstamp > tic`), so a full server still answers 200. The probe is aborted either way.
    """
    req = PreparedRequest(
        input_ids=[0], params=SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True), log_metrics=False
    )
    tic = time.monotonic()
    probe = asyncio.create_task(gen.final([req]))
    try:
        while time.monotonic() < tic + HEALTH_CHECK_TIMEOUT_S:
            done, _ = await asyncio.wait({probe}, timeout=0.1)
            if done:
                if probe.exception() is not None:
                    log.error("health check: %s", probe.exception())
                    return False
                results = probe.result()
                return bool(results) and results[0]["meta_info"]["completion_tokens"] == 1
            if gen.last_event_time > tic:
                return True
        log.error("health check: no engine output within %.0f s", HEALTH_CHECK_TIMEOUT_S)
        return False
    finally:
        probe.cancel()
