"""`python -m workflow_scripts.engine.launch_server`: the embedded engine behind SGLang's HTTP API.

Two processes, as SGLang runs them: this one (HTTP, tokenization, detokenization) and the engine process it
starts (`workflow_scripts.engine.engine_process`: model, batching, speculation), talking over ZMQ.
Start-up follows SGLang: validate flags, start the engine process and wait for its model, then serve
(`workflow_scripts.server.serving`: uvicorn, one warm-up /generate, "The server is fired up and ready to roll!").
A bad flag or model directory exits non-zero with one line on stderr naming the flag or path.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop

from workflow_scripts.server.cpu_binding import bind_front
from workflow_scripts.server.engine_client import EngineClient, EngineStartError
from workflow_scripts.server.server_args import ServerArgs, ServerArgsError, parse_server_args

log = logging.getLogger("workflow_scripts.server.launch_server")


def configure_logging(level: str) -> None:
    """SGLang's log format on stderr; uvicorn's loggers propagate into it (log_config=None)."""
    logging.basicConfig(
        level=level.upper(), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stderr
    )


def _fail(message: str) -> int:
    print(f"launch_server: error: {message}", file=sys.stderr, flush=True)
    return 2


async def _run(args: ServerArgs, caught: list[int]) -> int:
    """Start the engine process, import the HTTP side while it loads torch and the model (a second or so of each
    server's start-up), serve, and always stop the engine."""
    starting = asyncio.create_task(EngineClient.start(args))
    try:
        serving = await asyncio.to_thread(importlib.import_module, "workflow_scripts.server.serving")
    except BaseException:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)  # start() stops an engine it had started
        raise
    try:
        engine = await starting
    except EngineStartError as err:
        return _fail(str(err))
    try:
        tokenizer = serving.load_tokenizer(args)
        # Logged once the model loaded, so that a refused start-up prints only its one-line reason.
        log.info("server_args=%s", args.to_dict())
        return await serving.serve(args, serving.build_state(args, engine, tokenizer), caught)
    except ServerArgsError as err:
        return _fail(str(err))
    finally:
        await engine.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_server_args(sys.argv[1:] if argv is None else argv)
    except ServerArgsError as err:
        return _fail(str(err))
    configure_logging(args.log_level)
    bind_front(args.engine_cpus)  # before any thread starts: they inherit it
    caught: list[int] = []
    code = uvloop.run(_run(args, caught))  # SGLang's loop: libuv's sockets cost the front less CPU per chunk
    for sig in reversed(caught):  # end as the signal's default action would, as uvicorn does
        signal.raise_signal(sig)
    return code


if __name__ == "__main__":
    sys.exit(main())
