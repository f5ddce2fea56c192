"""`python -m workflow_scripts.engine.launch_server`: the embedded engine behind SGLang's HTTP API.

Start-up follows SGLang: validate flags, load the model, serve with uvicorn, send one warm-up /generate
through the real HTTP stack, then log "The server is fired up and ready to roll!" and let /health* answer 200.
A bad flag or model directory exits non-zero with one line on stderr naming the flag or path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import uvicorn

from workflow_scripts.engine.server_args import ServerArgs, ServerArgsError, parse_server_args
from workflow_scripts.engine.types import EngineConfigError

log = logging.getLogger("workflow_scripts.engine.launch_server")

WARMUP_TIMEOUT_S = 300.0
# On SIGTERM, streams still running get this long before uvicorn closes them (and the engine aborts them).
GRACEFUL_SHUTDOWN_S = 5
# SGLang's own warm-up request (`srt/entrypoints/http_server.py:_execute_server_warmup`).
WARMUP_REQUEST = {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}


def configure_logging(level: str) -> None:
    """SGLang's log format on stderr; uvicorn's loggers propagate into it (log_config=None)."""
    logging.basicConfig(
        level=level.upper(), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stderr
    )


def _fail(message: str) -> int:
    print(f"launch_server: error: {message}", file=sys.stderr, flush=True)
    return 2


def build_state(args: ServerArgs):
    """Load tokenizer and engine and wire them to the HTTP layer; raises EngineConfigError or ServerArgsError."""
    from tokenizers import Tokenizer

    from workflow_scripts.engine.http_api import ServerState
    from workflow_scripts.engine.http_schemas import ModelLimits
    from workflow_scripts.engine.scheduler import Engine
    from workflow_scripts.engine.server_generate import Generator

    tokenizer_file = Path(args.tokenizer_path) / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # tokenizers raises a bare Exception on a malformed file
        raise ServerArgsError(f"--tokenizer-path: cannot load {tokenizer_file}: {err}") from None
    engine = Engine(
        Path(args.model_path),
        args.spec_config(),
        args.max_running_requests,
        args.random_seed,
        context_length=args.context_length,
        num_threads=args.num_threads,
        dtype=args.dtype,
        chunked_prefill_size=args.chunked_prefill_size,
        enable_mixed_chunk=args.enable_mixed_chunk,
    )
    config = json.loads((Path(args.model_path) / "config.json").read_text())
    state = ServerState(
        generator=Generator(
            engine,
            lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip),
            speculating=args.speculative_algorithm is not None,
        ),
        limits=ModelLimits(
            vocab_size=engine.vocab_size,
            context_length=engine.context_length,
            encode=lambda text: tokenizer.encode(text).ids,
        ),
        server_info={**args.to_dict(), "engine": "specstudy-embedded"},
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
        engine_stats=engine.stats,
    )
    return engine, state


def _local_address(host: str) -> str:
    """Where this machine reaches a server bound to `host` (a wildcard bind is reached on loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


async def _warm_up(base_url: str) -> None:
    timeout = aiohttp.ClientTimeout(total=WARMUP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(base_url + "/generate", json=WARMUP_REQUEST) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"warm-up /generate answered {resp.status}: {body[:500]}")


async def _serve(args: ServerArgs, state) -> int:
    from workflow_scripts.engine.http_api import create_app

    config = uvicorn.Config(
        create_app(state),
        host=args.host,
        port=args.port,
        log_config=None,
        log_level=args.log_level,
        loop="asyncio",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if serving.done():  # e.g. the port is taken: uvicorn logged why and exits
        try:
            serving.result()
        except SystemExit as exc:
            return int(exc.code or 1)
        return 1
    try:
        await _warm_up(f"http://{_local_address(args.host)}:{args.port}")
    except Exception as err:
        log.error("warm-up failed, shutting down: %s", err)
        server.should_exit = True
        await serving
        return 1
    state.ready = True
    log.info("The server is fired up and ready to roll!")
    await serving
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_server_args(sys.argv[1:] if argv is None else argv)
    except ServerArgsError as err:
        return _fail(str(err))
    configure_logging(args.log_level)
    try:
        engine, state = build_state(args)
    except (EngineConfigError, ServerArgsError) as err:
        return _fail(str(err).splitlines()[0] if str(err) else type(err).__name__)
    # Logged once the model loaded, so that a refused start-up prints only its one-line reason.
    log.info("server_args=%s", args.to_dict())
    engine.start()
    try:
        return asyncio.run(_serve(args, state))
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
