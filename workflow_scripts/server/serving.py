"""The embedded engine's HTTP side, imported once the engine process is starting (`launch_server`): FastAPI,
uvicorn and aiohttp load while the engine process loads torch and the model, instead of before it starts.

Serving follows SGLang: uvicorn on the app, one warm-up /generate through the real HTTP stack, then "The server is
fired up and ready to roll!" and /health* answer 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import aiohttp
import uvicorn
from tokenizers import Tokenizer

from workflow_scripts.server.chat_template import load_chat_template
from workflow_scripts.server.engine_client import EngineClient
from workflow_scripts.server.http_api import ServerState, create_app
from workflow_scripts.server.metrics import ServerMetrics
from workflow_scripts.server.request_prep import ModelLimits
from workflow_scripts.server.server_args import ServerArgs, ServerArgsError
from workflow_scripts.server.server_generate import Generator

log = logging.getLogger("workflow_scripts.server.launch_server")

WARMUP_TIMEOUT_S = 300.0
# On SIGTERM, streams still running get this long before uvicorn closes them (and the engine aborts them).
GRACEFUL_SHUTDOWN_S = 5
# After the engine process died, /health* answer 503 this long (so a poller sees why), then the server exits 1.
ENGINE_DEATH_GRACE_S = 3.0
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# SGLang's own warm-up request (`srt/entrypoints/http_server.py:_execute_server_warmup`).
WARMUP_REQUEST = {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}


def load_tokenizer(args: ServerArgs) -> Tokenizer:
    tokenizer_file = Path(args.tokenizer_path) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # tokenizers raises a bare Exception on a malformed file
        raise ServerArgsError(f"--tokenizer-path: cannot load {tokenizer_file}: {err}") from None


def build_state(args: ServerArgs, engine: EngineClient, tokenizer: Tokenizer) -> ServerState:
    """Wire the started engine process, the tokenizer and its chat template to the HTTP layer."""
    try:
        chat_prompt = load_chat_template(Path(args.tokenizer_path))
    except ValueError as err:
        raise ServerArgsError(f"--tokenizer-path: {err}") from None
    config = json.loads((Path(args.model_path) / "config.json").read_text())
    return ServerState(
        generator=Generator(
            engine,
            lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip),
            spec=args.spec_config(),
            stream_interval=args.stream_interval,
            metrics=ServerMetrics(args.served_model_name) if args.enable_metrics else None,
        ),
        limits=ModelLimits(
            vocab_size=engine.info["vocab_size"],
            context_length=engine.info["context_length"],
            encode=lambda text: tokenizer.encode(text).ids,
            chat_prompt=chat_prompt,
        ),
        server_info={**args.to_dict(), "engine": "specstudy-embedded", "engine_torch": engine.info["torch"]},
        model_info={
            "model_path": args.model_path,
            "served_model_name": args.served_model_name,
            "tokenizer_path": args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
        },
        engine=engine,
        incremental_streaming=args.incremental_streaming_output,
        api_key=args.api_key,
        in_engine_bench=args.enable_in_engine_bench,
    )


def _local_address(host: str) -> str:
    """Where this machine reaches a server bound to `host` (a wildcard bind is reached on loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


async def _warm_up(base_url: str, api_key: str | None) -> None:
    timeout = aiohttp.ClientTimeout(total=WARMUP_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        async with session.post(base_url + "/generate", json=WARMUP_REQUEST) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"warm-up /generate answered {resp.status}: {body[:500]}")


class _Server(uvicorn.Server):
    """uvicorn's server, except that a SIGINT/SIGTERM it caught is re-raised by `main` once the engine process
    has stopped; uvicorn re-raises it as soon as HTTP serving ends, which would kill this process mid-cleanup."""

    def __init__(self, config: uvicorn.Config, caught: list[int]):
        super().__init__(config)
        self.caught = caught

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        original = {sig: signal.signal(sig, self._on_signal) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.caught.append(sig)
        self.handle_exit(sig, frame)


async def serve(args: ServerArgs, state: ServerState, caught: list[int]) -> int:
    config = uvicorn.Config(
        create_app(state),
        host=args.host,
        port=args.port,
        log_config=None,
        log_level=args.log_level,
        loop="uvloop",
        http="httptools",  # uvicorn's C parser (SGLang installs it via uvicorn[standard]); h11 is pure Python
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = _Server(config, caught)
    serving = asyncio.create_task(server.serve())
    engine_died = False

    def on_engine_death(_: int) -> None:
        """/health* answer 503 for ENGINE_DEATH_GRACE_S, then the server exits non-zero."""
        nonlocal engine_died
        engine_died = True
        log.error("shutting down in %.0f s: the engine process is gone", ENGINE_DEATH_GRACE_S)
        asyncio.get_running_loop().call_later(ENGINE_DEATH_GRACE_S, setattr, server, "should_exit", True)

    state.engine.on_death = on_engine_death
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if serving.done():  # e.g. the port is taken: uvicorn logged why and exits
        try:
            serving.result()
        except SystemExit as exc:
            return int(exc.code or 1)
        return 1
    try:
        await _warm_up(f"http://{_local_address(args.host)}:{args.port}", args.api_key)
    except Exception as err:
        log.error("warm-up failed, shutting down: %s", err)
        server.should_exit = True
        await serving
        return 1
    state.ready = True
    log.info("The server is fired up and ready to roll!")
    await serving
    return 1 if engine_died else 0


