"""What the server and the benchmark client cost the study: the same cells through HTTP and on the engine alone, side
by side.

For each concurrency and round it runs one cell of each setting three times: through a real embedded server with the
study's client ("http"); on that same server's engine, driven as a closed loop from inside its own process with no
HTTP, front or client per request ("in-engine": POST /in_engine_bench, `--enable-in-engine-bench`); and on another
engine driven in this process ("in-process"). All count the study's own figure, the aggregate tok/s over the cell's
steady window (analysis/metrics.py), on the same prompts, concurrency and request count.

- "http ÷ in-engine" is what the server's processes and the client cost a setting: one engine, two drivers.
- "in-engine ÷ in-process" is the same engine code in two processes with no server in either. On these shared hosts
  identical engine processes run at speeds several percent apart for their whole life (their memory and caches),
  as large as the server's cost at C=1; a ratio of two processes carries that offset whole, however many rounds.
- "http ÷ in-process" is both together (the figure before the in-engine side existed).

With a draft (`--draft`, `--speculative-num-steps K`), a STANDALONE steps-K setting runs beside the baseline and the
summary also gives steps-K ÷ baseline on each side, paired by round as the study pairs it (analysis/paired.py): if
the server taxed speculation more than plain decoding, the HTTP and in-engine ratios would differ. The cells of a
round run in a seeded random order (client/rounds.py), so a drift in the machine's load hits every side alike.

The host's speed moves by tens of percent between two cells seconds apart, which a ratio of consecutive cells
carries whole. So each side also reads its engine's own forward counters around each cell (/server_info's
internal state through HTTP and around the in-engine cell, `Scheduler.stats()` in-process): tokens per forward-second
is the engine's pace in that cell. Each ratio then splits into the pace ratio (the forwards ran slower: the host,
the server's other processes competing for the core, caches or memory, or more and smaller prefills of requests
that arrived apart)
and the rest (time outside forwards: the requests' way through the front and the client, the idle engine between
them). The seconds per decode forward, compared the same way, tell the decode forwards apart from the prefills.

The client's CPU time per streamed chunk and its headroom (the chunk rate one core of client could sustain ÷ the
chunk rate the server produced) say whether the client itself is what limits a measurement.

    python -m benchmarks.client_overhead --model results/smoke/models/target [--concurrency 1 4 16 64]
        [--streaming incremental|cumulative] [--per-concurrency 4]
        [--draft results/smoke/models/draft --speculative-num-steps 2] [--omp-threads-bind 1] [--stream-interval N]

`--omp-threads-bind CORES` adds two sides, "http-bound" and its "in-engine-bound": another server per setting
started with SGLang's `SGLANG_CPU_OMP_THREADS_BIND=CORES` (server/cpu_binding.py: the engine's compute thread on
those cores; the front and the engine's socket threads on the rest), measured in the same rounds, so that bound ÷
unbound is a ratio taken side by side, and each server's cost is read against its own engine.

`--per-concurrency 1` measures the study's own cell (C warm-up requests, then max(8, C) measured ones). The servers
are started as the study starts them (`launcher.command.build_command`), streaming incremental deltas by default
(`server.incremental_streaming`).
"""

from __future__ import annotations

import argparse
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

# Both sides run one torch thread (the server via --num-threads 1). torch.set_num_threads() does not reach the
# in-process engine's scheduling thread, whose OpenMP pool would otherwise take every core and spin under load.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import requests  # noqa: E402

from workflow_scripts.analysis.metrics import steady_window_tok_s  # noqa: E402
from workflow_scripts.analysis.paired import Paired, paired_ratio  # noqa: E402
from workflow_scripts.client.cell import CellPlan, CellResult, run_cell  # noqa: E402
from workflow_scripts.client.prompts import load_tokenizer, synthetic_prompts  # noqa: E402
from workflow_scripts.client.rounds import seeded_order  # noqa: E402
from workflow_scripts.engine.closed_loop import Timed  # noqa: E402
from workflow_scripts.engine.closed_loop import run_cell as run_in_process  # noqa: E402
from workflow_scripts.engine.scheduler import Scheduler  # noqa: E402
from workflow_scripts.engine.types import FORWARD_MODES, SamplingParams, SpecConfig  # noqa: E402
from workflow_scripts.launcher.command import ServerSpec, build_command  # noqa: E402
from workflow_scripts.launcher.process import ServerProcess, free_port  # noqa: E402
from workflow_scripts.server.cpu_binding import ENV as BIND_ENV  # noqa: E402

MIN_MEASURED = 8  # the study's benchmark.requests_per_cell.min
IN_ENGINE = {"http": "in-engine", "http-bound": "in-engine-bound"}  # each server's own engine, driven in-engine


def comparisons(servers: list[str]) -> list[tuple[str, str, str]]:
    """(numerator side, denominator side, what the ratio measures) for the servers measured."""
    return ([(s, IN_ENGINE[s], "the server's cost: one engine, through HTTP or driven from its own process")
             for s in servers]
            + [("in-engine", "in-process", "the same engine in two processes, no server in either: the process's "
                                           "own speed")]
            + [(s, "in-process", "both together") for s in servers])


def http_tok_s(result: CellResult, concurrency: int) -> float:
    """The steady-window aggregate of a cell the study's client measured."""
    ok = [r for r in result.records if r.error is None]
    return steady_window_tok_s(
        np.array([r.send_ts for r in result.records if r.request_id not in result.warmup_ids]),
        np.array([r.end_ts for r in result.records if r.end_ts is not None]),
        concurrency,
        np.concatenate([np.asarray(r.chunk_ts, dtype="float64") for r in ok]),
        np.concatenate([np.asarray(r.chunk_tokens, dtype="float64") for r in ok]),
    )


def in_process_tok_s(cell: list[Timed], warmup: int, concurrency: int) -> float:
    """The same figure for a cell driven in-process: a request's tokens of one engine step form one chunk, and
    the first `warmup` submitted are the warm-up, as in the client's closed loop."""
    chunk_ts, chunk_tokens = [], []
    for rec in cell:
        times, counts = np.unique(np.asarray(rec.times, dtype="float64"), return_counts=True)
        chunk_ts.append(times)
        chunk_tokens.append(counts.astype("float64"))
    return steady_window_tok_s(
        np.array([rec.submit for rec in cell[warmup:]]),
        np.array([rec.times[-1] for rec in cell if rec.times]),
        concurrency,
        np.concatenate(chunk_ts),
        np.concatenate(chunk_tokens),
    )


def engine_counters(stats: dict) -> np.ndarray:
    """(tokens generated, wall seconds in forwards of every mode, in decode forwards, decode forwards) so far, from
    the engine's stats."""
    return np.array([stats["total_generated_tokens"], sum(stats[f"total_{mode}_seconds"] for mode in FORWARD_MODES),
                     stats["total_decode_seconds"], stats["total_decode_forwards"]])


def server_counters(url: str) -> np.ndarray:
    """The same for a server, from its /server_info (the engine's internal state)."""
    return engine_counters(requests.get(url + "/server_info", timeout=30).json()["internal_states"][0])


def in_engine_cell(url: str, ids: list[list[int]], params: dict, concurrency: int) -> tuple[list[Timed], np.ndarray]:
    """The cell on the server's own engine, driven from the engine process (POST /in_engine_bench), and the
    engine's counters over it."""
    resp = requests.post(url + "/in_engine_bench", json={"input_ids": ids, "sampling_params": params,
                                                          "concurrency": concurrency}, timeout=900)
    if resp.status_code != 200:
        raise SystemExit(f"{url}/in_engine_bench: HTTP {resp.status_code}: {resp.text[:300]}")
    body = resp.json()
    cell = [Timed(r["submit"], r["times"], len(r["times"])) for r in body["requests"]]
    return cell, engine_counters(body["engine_after"]) - engine_counters(body["engine_before"])


def settings(steps: int | None) -> dict[str, dict]:
    """The compared settings as the study writes them (SGLang flag names, dashes as underscores)."""
    out: dict[str, dict] = {"baseline": {}}
    if steps:
        out[f"steps{steps}"] = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": steps,
                                "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}
    return out


def spec_config(setting: dict, draft: Path | None) -> SpecConfig | None:
    if "speculative_num_steps" not in setting:
        return None
    return SpecConfig("STANDALONE", setting["speculative_num_steps"], 1, setting["speculative_num_draft_tokens"], draft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target model dir (e.g. results/smoke/models/target)")
    parser.add_argument("--draft", type=Path, help="draft model dir: adds a STANDALONE setting beside the baseline")
    parser.add_argument("--speculative-num-steps", type=int, default=2, help="the draft setting's steps (with --draft)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--streaming", choices=("incremental", "cumulative"), default="incremental",
                        help="the server's streaming mode (--incremental-streaming-output or SGLang's default)")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--per-concurrency", type=int, default=4,
                        help="measured requests per unit of concurrency (at least 8); 1 is the study's default cell")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency (medians, paired CIs)")
    parser.add_argument("--omp-threads-bind", default=None, metavar="CORES",
                        help="also measure servers started with SGLANG_CPU_OMP_THREADS_BIND=CORES (side http-bound)")
    parser.add_argument("--stream-interval", type=int, default=None,
                        help="the servers' --stream-interval (SGLang's: a chunk every N tokens): how much of the "
                             "HTTP side's cost is the per-token work of the front and the client")
    parser.add_argument("--log", type=Path, default=Path("/tmp/client_overhead_server.log"))
    args = parser.parse_args()
    if args.speculative_num_steps < 1:
        parser.error("--speculative-num-steps must be at least 1")
    if args.stream_interval is not None and args.stream_interval < 1:
        parser.error(f"--stream-interval must be at least 1, got {args.stream_interval}")

    extra = ["--enable-in-engine-bench"] + (["--stream-interval", str(args.stream_interval)]
                                             if args.stream_interval else [])
    compared = {name: {**setting, "extra_args": extra}
                for name, setting in settings(args.speculative_num_steps if args.draft else None).items()}
    prompts = synthetic_prompts(load_tokenizer(args.model), 64, 32, seed=0)
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.output_len, "ignore_eos": True}
    engine_params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
    incremental = args.streaming == "incremental"
    slots = max(args.concurrency)
    spec = ServerSpec("embedded", str(args.model), str(args.draft) if args.draft else None, "127.0.0.1", slots, 0,
                      num_threads=1, incremental_streaming=incremental)
    servers = {"http": {}} | ({"http-bound": {BIND_ENV: args.omp_threads_bind}} if args.omp_threads_bind else {})
    sides = [*servers, *(IN_ENGINE[s] for s in servers), "in-process"]
    server_of = {IN_ENGINE[s]: s for s in servers}
    print("| C | round | setting | side | HTTP tok/s | chunks | client CPU ms/chunk | client CPU ms/token "
          "| client CPU share | headroom | in-engine tok/s | HTTP ÷ in-engine |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    # measured[(c, setting, side)] = the steady-window tok/s of each round, in round order; pace[...] the engine's
    # tokens per forward-second and decode forwards per decode-second over the same cells
    measured: dict[tuple[int, str, str], list[float]] = {}
    pace: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    with ExitStack() as stack:
        urls, engines = {}, {}
        for name, setting in compared.items():
            for side, env in servers.items():
                port = free_port()
                log = args.log.with_name(f"{args.log.stem}_{name}_{side}{args.log.suffix}")
                stack.enter_context(ServerProcess(build_command(spec, setting, port), log, f"http://127.0.0.1:{port}",
                                                  300, env))
                urls[name, side] = f"http://127.0.0.1:{port}"
            engines[name] = Scheduler(args.model, spec_config(setting, args.draft), slots, 0, num_threads=1)
            engines[name].start()
            stack.callback(engines[name].stop)
        for c in args.concurrency:
            plan = CellPlan(concurrency=c, warmup=c, measured=max(MIN_MEASURED, args.per_concurrency * c),
                            incremental=incremental)
            ids = [prompts[i % len(prompts)].input_ids for i in range(plan.total)]
            for rnd in range(args.rounds):
                http_results: dict[tuple[str, str], CellResult] = {}
                for key in seeded_order([f"{name}|{side}" for name in compared for side in sides],
                                        "client_overhead", c, rnd):
                    name, side = key.split("|")
                    if side in servers:
                        before = server_counters(urls[name, side])
                        result = run_cell(urls[name, side], plan, prompts, params, f"c{c}r{rnd}{name}{side}")
                        counted = server_counters(urls[name, side]) - before
                        _check(c, name, result)
                        http_results[name, side] = result
                        measured.setdefault((c, name, side), []).append(http_tok_s(result, c))
                    elif side in server_of:
                        cell, counted = in_engine_cell(urls[name, server_of[side]], ids, params, c)
                        measured.setdefault((c, name, side), []).append(in_process_tok_s(cell, plan.warmup, c))
                    else:
                        before = engine_counters(engines[name].stats())
                        cell = run_in_process(engines[name], ids, engine_params, c)
                        counted = engine_counters(engines[name].stats()) - before
                        measured.setdefault((c, name, side), []).append(in_process_tok_s(cell, plan.warmup, c))
                    tokens, seconds, decode_s, decodes = counted
                    pace.setdefault((c, name, side), []).append((tokens / seconds, decodes / decode_s))
                for (name, side), result in http_results.items():
                    _report(c, rnd, name, side, result, measured[c, name, side][-1],
                            measured[c, name, IN_ENGINE[side]][-1])
    _summary(args.concurrency, list(compared), list(servers), measured, pace)


def _check(c: int, name: str, result: CellResult) -> None:
    errors = [r.error for r in result.records if r.error]
    if errors:
        raise SystemExit(f"c={c} {name}: {len(errors)} requests failed, e.g. {errors[0]}")


def _report(c: int, rnd: int, name: str, side: str, result: CellResult, http: float, in_engine: float) -> None:
    """Print one round's row for one setting."""
    chunks = sum(len(r.chunk_ts) for r in result.records)
    tokens = sum(r.output_tokens or 0 for r in result.records)
    cpu_per_chunk = result.client_cpu_s / chunks
    headroom = (1 / cpu_per_chunk) / (chunks / result.wall_s)
    print(
        f"| {c} | {rnd} | {name} | {side} | {http:.0f} | {chunks} | {1e3 * cpu_per_chunk:.3f} | "
        f"{1e3 * result.client_cpu_s / tokens:.3f} | {result.client_cpu_s / result.wall_s:.0%} | {headroom:.1f}× "
        f"| {in_engine:.0f} | {http / in_engine:.2f} |",
        flush=True,
    )


def _summary(concurrency: list[int], names: list[str], servers: list[str],
             measured: dict[tuple[int, str, str], list[float]],
             pace: dict[tuple[int, str, str], list[tuple[float, float]]]) -> None:
    print()
    for name in names:
        for num, den, what in comparisons(servers):
            print(f"{num} ÷ {den}, {name} ({what}), geometric mean of the within-round ratios [95% CI]: the tok/s; "
                  "the engine's pace (tokens per forward-second); the rest (tok/s ratio ÷ pace ratio); decode "
                  "forwards per decode-second")
            for c in concurrency:
                high, low = (np.array(measured[c, name, s]) for s in (num, den))
                (high_pace, high_decode), (low_pace, low_decode) = (np.array(pace[c, name, s]).T for s in (num, den))
                print(f"  C={c}: tok/s {_ratio_text(paired_ratio(low, high))} (median "
                      f"{statistics.median(high / low):.2f}); pace {_ratio_text(paired_ratio(low_pace, high_pace))}; "
                      f"rest {_ratio_text(paired_ratio(low / low_pace, high / high_pace))}; "
                      f"decode {_ratio_text(paired_ratio(low_decode, high_decode))}")
        if "http-bound" in servers:
            print(f"http-bound ÷ http, {name}, geometric mean of the within-round ratios [95% CI]: " + ", ".join(
                f"C={c}: " + _ratio_text(paired_ratio(np.array(measured[c, name, "http"]),
                                                      np.array(measured[c, name, "http-bound"])))
                for c in concurrency))
    if len(names) < 2:
        return
    control, candidate = names
    print(f"\n{candidate} ÷ {control}, geometric mean of the within-round ratios [95% CI] (analysis/paired.py); the last "
          "column pairs each round's HTTP ratio with its in-engine ratio (the same two engines):")
    print("| C | through HTTP | in-engine | in-process | HTTP ratio ÷ in-engine ratio |")
    print("|---|---|---|---|---|")
    for c in concurrency:
        ratio = {side: np.divide(measured[c, candidate, side], measured[c, control, side])
                 for side in ("http", "in-engine")}
        cells = [paired_ratio(np.array(measured[c, control, side]), np.array(measured[c, candidate, side]))
                 for side in ("http", "in-engine", "in-process")] + [paired_ratio(ratio["in-engine"], ratio["http"])]
        print(f"| {c} | " + " | ".join(_ratio_text(p) for p in cells) + " |")


def _ratio_text(p: Paired) -> str:
    return f"{1 + p.diff_pct / 100:.2f}× [{1 + p.ci_low_pct / 100:.2f}, {1 + p.ci_high_pct / 100:.2f}]"


if __name__ == "__main__":
    main()
