"""The front's handle on the engine process: start it, talk to it over ZMQ, notice when it dies, stop it.

SGLang's TokenizerManager talks to its Scheduler process the same way (pickled messages over ZMQ PUSH/PULL);
the protocol is described in `workflow_scripts.engine.engine_process`. Each submitted request gets an
asyncio.Queue that receives its TokenEvents in order, then (on refusal or engine death) an exception instance
that the consumer raises. The event loop learns that the engine process exited from a pidfd, so nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from workflow_scripts.engine.torch_setup import engine_threads
from workflow_scripts.engine.types import SamplingParams, TokenEvent
from workflow_scripts.server.server_args import ServerArgs

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 20.0
SHUTDOWN_TIMEOUT_S = 10.0
EXIT_MESSAGE_WAIT_S = 2.0


class EngineStartError(RuntimeError):
    """The engine process refused its flags (one line naming the flag or path) or exited during start-up."""


class EngineDied(RuntimeError):
    """The engine process is gone; every request in flight and every later one fails with this."""


class EngineRefused(ValueError):
    """The engine refused one request; the message starts with the field at fault, like a RequestError."""


def engine_config(args: ServerArgs, requests_address: str, outputs_address: str) -> dict:
    """What the engine process needs from the resolved flags (JSON, passed on its command line)."""
    spec = args.spec_config()
    return {
        "parent_pid": os.getpid(),
        "requests_address": requests_address,
        "outputs_address": outputs_address,
        "log_level": args.log_level,
        "model_path": args.model_path,
        "max_running_requests": args.max_running_requests,
        "random_seed": args.random_seed,
        "context_length": args.context_length,
        "num_threads": args.num_threads,
        "cpus": list(args.engine_cpus) if args.engine_cpus else None,
        "dtype": args.dtype,
        "chunked_prefill_size": args.chunked_prefill_size,
        "enable_mixed_chunk": args.enable_mixed_chunk,
        "spec": None
        if spec is None
        else {
            "algorithm": spec.algorithm,
            "num_steps": spec.num_steps,
            "eagle_topk": spec.eagle_topk,
            "num_draft_tokens": spec.num_draft_tokens,
            "draft_model_path": str(spec.draft_model_path) if spec.draft_model_path else None,
            "adaptive_config": spec.adaptive_config,
        },
    }


def engine_env(args: ServerArgs) -> dict[str, str]:
    """The engine process's environment: its thread count (engine/torch_setup.py, as the in-process engine
    resolves it) also sizes the OpenMP/MKL pools from the start, so no pool of every core is ever created."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(engine_threads(args.num_threads))
    return env


class EngineClient:
    """submit/abort/stats against the engine process; construct with `await EngineClient.start(args)`."""

    def __init__(self, proc: subprocess.Popen, ipc_dir: str, requests: zmq.Socket, outputs: zmq.asyncio.Socket):
        self._proc = proc
        self._ipc_dir = ipc_dir
        self._requests = requests
        self._outputs = outputs
        self._queues: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}  # stats and closed_loop answers awaited, by token
        self._tokens = itertools.count()
        self._stopping = False
        self._reader: asyncio.Task | None = None
        self._pidfd = os.pidfd_open(proc.pid)
        self._exited = asyncio.Event()
        asyncio.get_running_loop().add_reader(self._pidfd, self._on_exit)
        self.info: dict = {}
        self.dead = False
        self.last_event_time = 0.0  # time.monotonic() of the latest TokenEvent for any request
        self.on_death: Callable[[int], None] = lambda returncode: None

    @classmethod
    async def start(cls, args: ServerArgs) -> EngineClient:
        """Start the engine process and wait until its model is loaded; raises EngineStartError."""
        ipc_dir = tempfile.mkdtemp(prefix="specstudy-engine-")
        requests_address, outputs_address = f"ipc://{ipc_dir}/requests", f"ipc://{ipc_dir}/outputs"
        ctx = zmq.asyncio.Context.instance()
        requests = zmq.Context.instance().socket(zmq.PUSH)
        requests.setsockopt(zmq.SNDHWM, 0)
        requests.setsockopt(zmq.LINGER, 0)
        requests.bind(requests_address)
        outputs = ctx.socket(zmq.PULL)
        outputs.setsockopt(zmq.RCVHWM, 0)
        outputs.setsockopt(zmq.LINGER, 0)
        outputs.bind(outputs_address)
        config = engine_config(args, requests_address, outputs_address)
        proc = subprocess.Popen(
            [sys.executable, "-m", "workflow_scripts.engine.engine_process", json.dumps(config)], env=engine_env(args)
        )
        client = cls(proc, ipc_dir, requests, outputs)
        try:
            client.info = await client._handshake()
        except BaseException:
            await client.stop()
            raise
        client._reader = asyncio.create_task(client._read_outputs())
        return client

    async def _handshake(self) -> dict:
        recv = asyncio.ensure_future(self._outputs.recv_pyobj())
        exited = asyncio.ensure_future(self._exited.wait())
        try:
            await asyncio.wait({recv, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not recv.done():  # it exited; a refusal it sent just before may still be on its way
                await asyncio.wait({recv}, timeout=EXIT_MESSAGE_WAIT_S)
        finally:
            exited.cancel()
            if not recv.done():
                recv.cancel()
        if recv.cancelled():
            raise EngineStartError(f"the engine process exited with code {self._proc.returncode} during start-up")
        kind, payload = recv.result()
        if kind == "failed":
            raise EngineStartError(payload)
        if kind != "ready":
            raise EngineStartError(f"the engine process sent {kind!r} instead of 'ready'")
        return payload

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, rid: str, input_ids: list[int], params: SamplingParams) -> asyncio.Queue:
        """Queue one request; its TokenEvents (or an exception instance) arrive on the returned queue."""
        if self.dead:
            raise EngineDied("the engine process is not running")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        self._send(("submit", rid, input_ids, params))
        return queue

    def abort(self, rid: str) -> None:
        """Abort a request still running in the engine; a no-op for one already finished."""
        if self._queues.pop(rid, None) is not None and not self.dead:
            self._send(("abort", rid))

    async def stats(self) -> dict:
        """The scheduler's counters (Scheduler.stats()); raises EngineDied if the engine is gone."""
        return await self._call(STATS_TIMEOUT_S, "stats")

    async def closed_loop(self, prompts: list[list[int]], params: list[SamplingParams], concurrency: int,
                          timeout_s: float) -> dict:
        """Run one closed-loop cell on the engine itself (engine_process.closed_loop_cell: the in-engine bench)."""
        return await self._call(timeout_s + STATS_TIMEOUT_S, "closed_loop", prompts, params, concurrency, timeout_s)

    async def _call(self, timeout_s: float, kind: str, *args) -> dict:
        """Send a command that the engine answers with (kind, token, dict), and await that answer."""
        if self.dead:
            raise EngineDied("the engine process is not running")
        token = next(self._tokens)
        future = asyncio.get_running_loop().create_future()
        self._calls[token] = future
        self._send((kind, token, *args))
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._calls.pop(token, None)

    def _send(self, msg: tuple, warn: bool = True) -> None:
        """Never blocks: with no high-water mark a send only fails when no engine is connected, i.e. it is gone
        (its exit reaches `_on_exit` through the pidfd a moment later)."""
        try:
            self._requests.send_pyobj(msg, flags=zmq.NOBLOCK)
        except zmq.Again:
            if warn:
                log.warning("engine process not connected; dropped %r", msg[0])

    async def _read_outputs(self) -> None:
        while True:
            msg = await self._outputs.recv_pyobj()
            if isinstance(msg, list):  # one forward's TokenEvents
                self._dispatch(msg)
            elif isinstance(msg, TokenEvent):
                self._dispatch([msg])
            elif msg[0] == "refused":
                queue = self._queues.pop(msg[1], None)
                if queue is not None:
                    queue.put_nowait(EngineRefused(msg[2]))
            elif msg[0] in ("stats", "closed_loop"):
                future = self._calls.get(msg[1])
                if future is not None and not future.done():
                    future.set_result(msg[2])

    def _dispatch(self, events: list[TokenEvent]) -> None:
        self.last_event_time = time.monotonic()
        for event in events:
            queue = self._queues.get(event.rid)
            if queue is not None:
                queue.put_nowait(event)
                if event.finished:
                    del self._queues[event.rid]

    # ---- lifetime ----------------------------------------------------------------------------
    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        returncode = self._proc.wait()
        self._exited.set()
        if self._stopping:
            return
        self.dead = True
        log.error("the engine process (pid %d) exited with code %d", self._proc.pid, returncode)
        died = EngineDied(f"the engine process exited with code {returncode}")
        for queue in self._queues.values():
            queue.put_nowait(died)
        self._queues.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(died)
        self.on_death(returncode)

    async def stop(self) -> None:
        """Ask the engine process to stop, kill it if it does not within SHUTDOWN_TIMEOUT_S, free the sockets."""
        self._stopping = True
        if self._proc.poll() is None and not self._exited.is_set():
            self._send(("shutdown",), warn=False)  # not connected: it is exiting already (e.g. a failed start-up)
            try:
                await asyncio.wait_for(self._exited.wait(), SHUTDOWN_TIMEOUT_S)
            except TimeoutError:
                log.error("the engine process did not stop within %.0f s; killing it", SHUTDOWN_TIMEOUT_S)
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()
        loop = asyncio.get_running_loop()
        if not self._exited.is_set():
            loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._requests.close()
        self._outputs.close()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
