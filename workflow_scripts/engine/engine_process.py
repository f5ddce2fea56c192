"""The engine process: the scheduler (model, batching, speculation) behind a ZMQ pair, as SGLang's Scheduler runs.

`python -m workflow_scripts.engine.engine_process CONFIG_JSON` is started by the front
(`workflow_scripts.server.engine_client`), never by hand. The front binds two sockets and this process connects:

    requests (front PUSH -> engine PULL):  ("submit", rid, input_ids, SamplingParams) | ("abort", rid)
                                           | ("stats", token) | ("shutdown",)
                                           | ("closed_loop", token, prompts, SamplingParams, concurrency, timeout_s)
    outputs  (engine PUSH -> front PULL):  ("ready", info) | ("failed", one_line) at start-up (info["torch"]: the
                                           scheduling thread's torch setup, engine/torch_setup.py), then
                                           list[TokenEvent] (one forward's) | TokenEvent
                                           | ("refused", rid, message) | ("stats", token, dict)
                                           | ("closed_loop", token, dict)

Messages are pickled copies; nothing is shared. The main thread blocks on the requests socket (an idle engine
costs no CPU) while the scheduling thread runs the batches and pushes each TokenEvent from its own socket.
The process dies with the front (PR_SET_PDEATHSIG) and ignores SIGINT/SIGTERM sent to the process group: the
front stops it in order, after the last HTTP stream closed.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import zmq

from workflow_scripts.engine.closed_loop import run_cell
from workflow_scripts.engine.types import EngineConfigError, SamplingParams, SpecConfig, TokenEvent

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the front dies, however it dies (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the front died before prctl took effect
        os._exit(1)


def push_socket(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)  # never block the scheduler on a slow reader
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


class EventSink:
    """Sends TokenEvents from whichever thread emits them, each thread on its own socket (ZMQ sockets are not
    thread-safe); within one thread, and so for one request, order is kept."""

    def __init__(self, ctx: zmq.Context, address: str):
        self._ctx = ctx
        self._address = address
        self._local = threading.local()
        self._sockets: list[zmq.Socket] = []

    def __call__(self, event: TokenEvent) -> None:
        self._socket().send_pyobj(event)

    def batch(self, events: list[TokenEvent]) -> None:
        """One forward's events in one message (the scheduler calls this once per forward): a pickled list costs
        ~1 us an event to send and receive, against ~20 us for a message each."""
        self._socket().send_pyobj(events)

    def _socket(self) -> zmq.Socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._local.sock = push_socket(self._ctx, self._address)
            self._sockets.append(sock)
        return sock

    def reply(self, msg: tuple) -> None:
        """A reply to the front from a thread other than the main one (which owns the replies socket)."""
        self._socket().send_pyobj(msg)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def load_engine(config: dict):
    """The scheduler, built from the front's resolved flags; raises EngineConfigError naming the flag."""
    from workflow_scripts.engine.scheduler import Scheduler

    spec = config["spec"]
    return Scheduler(
        Path(config["model_path"]),
        SpecConfig(**{**spec, "draft_model_path": Path(spec["draft_model_path"]) if spec["draft_model_path"] else None})
        if spec
        else None,
        config["max_running_requests"],
        config["random_seed"],
        context_length=config["context_length"],
        num_threads=config["num_threads"],
        dtype=config["dtype"],
        chunked_prefill_size=config["chunked_prefill_size"],
        enable_mixed_chunk=config["enable_mixed_chunk"],
    )


def closed_loop_cell(engine, token: int, prompts: list[list[int]], params: list[SamplingParams], concurrency: int,
                     timeout_s: float, sink: EventSink) -> None:
    """Run one closed-loop cell on the engine from this process (the in-engine bench) and reply with each
    request's submit and token times (relative to the first submit) and output ids, and the engine's counters
    around the cell. It is the HTTP path's own engine, so the two compare without another process's speed in
    between: identical engine processes differ by several percent on a shared host."""
    try:
        before = engine.stats()
        cell = run_cell(engine, prompts, params, concurrency, timeout_s)
        after = engine.stats()
    except (ValueError, TimeoutError) as err:
        sink.reply(("closed_loop", token, {"error": str(err), "timed_out": isinstance(err, TimeoutError)}))
        return
    except Exception as err:  # a fault of ours: answer it now, or the front would wait out timeout_s for nothing
        log.exception("in-engine bench failed")
        sink.reply(("closed_loop", token, {"error": f"in-engine bench failed: {err!r}", "internal": True}))
        return
    start = min(rec.submit for rec in cell)
    requests = [{"submit": rec.submit - start, "times": [t - start for t in rec.times], "output_ids": rec.output_ids}
                for rec in cell]
    sink.reply(("closed_loop", token, {"requests": requests, "engine_before": before, "engine_after": after}))


def serve(engine, requests: zmq.Socket, replies: zmq.Socket, sink: EventSink) -> None:
    """Run the front's commands until it says shutdown."""
    while True:
        msg = requests.recv_pyobj()
        kind = msg[0]
        if kind == "submit":
            _, rid, input_ids, params = msg
            try:
                engine.submit(rid, input_ids, params, sink)
            except ValueError as err:  # the message starts with the field at fault
                replies.send_pyobj(("refused", rid, str(err)))
        elif kind == "abort":
            engine.abort(msg[1])
        elif kind == "stats":
            replies.send_pyobj(("stats", msg[1], engine.stats()))
        elif kind == "closed_loop":  # on a thread of its own, so that stats, aborts and shutdown still get through
            threading.Thread(target=closed_loop_cell, args=(engine, *msg[1:], sink), name="in-engine-bench",
                             daemon=True).start()
        elif kind == "shutdown":
            return
        else:
            log.error("engine process: unknown command %r ignored", kind)


def compute_and_io_cores(cpus: list[int] | None) -> tuple[set[int], set[int]]:
    """(the scheduling thread's cores, the other threads' cores) under SGLANG_CPU_OMP_THREADS_BIND.

    SGLang binds its OpenMP compute threads to the named cores; the threads that wait on sockets (this main thread,
    ZMQ's I/O thread) go with the front onto the rest, so that their wake-ups never land on a forward's core (on a
    2-core machine that gained nothing measurable: docs/measurements/client_overhead.md). Unbound, both are every
    core this process may use."""
    allowed = os.sched_getaffinity(0)
    if not cpus:
        return allowed, allowed
    compute = set(cpus)
    return compute, (allowed - compute) or compute


def main(argv: Sequence[str]) -> int:
    config = json.loads(argv[0])
    die_with_parent(config["parent_pid"])
    compute, rest = compute_and_io_cores(config["cpus"])
    os.sched_setaffinity(0, rest)  # before ZMQ starts its I/O threads: they inherit this thread's cores
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=config["log_level"].upper(), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
    )
    ctx = zmq.Context()
    requests = ctx.socket(zmq.PULL)
    requests.setsockopt(zmq.RCVHWM, 0)
    requests.setsockopt(zmq.LINGER, 0)
    requests.connect(config["requests_address"])
    replies = push_socket(ctx, config["outputs_address"])
    os.sched_setaffinity(0, compute)  # torch's pools and the scheduling thread inherit the compute cores
    try:
        engine = load_engine(config)
    except EngineConfigError as err:
        replies.send_pyobj(("failed", str(err).splitlines()[0] if str(err) else type(err).__name__))
        replies.close(linger=2000)
        return 2
    engine.start()
    sink = EventSink(ctx, config["outputs_address"])
    replies.send_pyobj(("ready", {"vocab_size": engine.vocab_size, "context_length": engine.context_length,
                                  "pid": os.getpid(), "torch": engine.torch_config}))
    os.sched_setaffinity(0, rest)  # this thread only waits on the requests socket
    try:
        serve(engine, requests, replies, sink)
    finally:
        engine.stop()  # held requests get their final abort event
        sink.close()
        replies.close()
        requests.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
