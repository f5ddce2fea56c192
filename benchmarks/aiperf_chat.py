"""AIPerf's default chat benchmark against the embedded server: does every request complete?

AIPerf (NVIDIA's successor of genai-perf) defaults to `--endpoint-type chat`, the endpoint most OpenAI clients
use. It cannot share the study's venv (aiperf 0.13 pins pandas 2.x), so it runs from its own venv:

    python -m venv /work/wt/aiperf_venv && /work/wt/aiperf_venv/bin/pip install aiperf==0.13.0   # no torch
    python -m benchmarks.aiperf_chat --aiperf /work/wt/aiperf_venv/bin/aiperf \
        --model /work/main/results/embedded-cpu/models/target [--requests 32 --concurrency 8]

It starts the embedded server on the model and runs `aiperf profile --endpoint-type chat --streaming` twice: with
AIPerf's defaults otherwise (synthetic prompts from the model's own tokenizer, no output cap: each answer runs to
EOS or the context length), then with `--extra-inputs ignore_eos:true` and a fixed output length. For each it
prints the requests the server answered 200 (its access log) and what AIPerf counted: requests completed and
errored (by kind), TTFT and output tok/s. Exit status 1 unless every request of both runs completed without error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

DEFAULT_MODEL = Path("/work/main/results/embedded-cpu/models/target")


def _metric(export: dict, name: str, stat: str) -> float | None:
    value = export.get(name)
    return value.get(stat) if isinstance(value, dict) else None


def run_aiperf(aiperf: Path, url: str, model: Path, requests: int, concurrency: int, out_dir: Path,
               extra: list[str]) -> dict:
    """AIPerf's JSON export of one profile run (its `profile_export_aiperf.json`)."""
    argv = [str(aiperf), "profile", "--model", "default", "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(model), "--request-count", str(requests), "--concurrency", str(concurrency),
            "--random-seed", "0", "--ui-type", "none", "--output-artifact-dir", str(out_dir), *extra]
    # AIPerf's offline mode looks the tokenizer up in the Hub cache only; a local path needs its online mode
    # (which loads an absolute path as it is, with no network access)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"aiperf failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    exports = sorted(out_dir.rglob("profile_export_aiperf.json"))
    if not exports:
        raise SystemExit(f"aiperf wrote no profile_export_aiperf.json under {out_dir}:\n{proc.stdout[-3000:]}")
    return json.loads(exports[-1].read_text())


def _answered(log: Path, since: int) -> int:
    """The chat requests the server answered 200, from its access log (the lines after byte `since`)."""
    with open(log, "rb") as fh:
        fh.seek(since)
        return fh.read().decode(errors="replace").count('"POST /v1/chat/completions HTTP/1.1" 200')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf", type=Path, required=True, help="the aiperf executable of its own venv")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="target model dir (with its tokenizer)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-tokens", type=int, default=64,
                        help="AIPerf's --prompt-output-tokens-mean for the ignore_eos run")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "aiperf_chat_server.log")
    args = parser.parse_args()

    spec = ServerSpec("embedded", str(args.model), None, "127.0.0.1", args.concurrency, 0, num_threads=1)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # AIPerf's defaults; then with SGLang's ignore_eos, so that an answer the model ends at once (EOS first:
    # AIPerf counts an empty answer as an error) still has tokens
    runs = {"defaults": [], f"ignore_eos, {args.output_tokens} tokens": [
        "--extra-inputs", "ignore_eos:true", "--prompt-output-tokens-mean", str(args.output_tokens)]}
    print(f"aiperf profile --endpoint-type chat --streaming, {args.requests} requests at concurrency "
          f"{args.concurrency}, model {args.model}")
    print("| run | sent | server answered 200 | AIPerf completed | AIPerf errored | TTFT p50 ms | TTFT p99 ms "
          "| output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    clean = True
    with ServerProcess(build_command(spec, {}, port), args.log, url, 300):
        for name, extra in runs.items():
            since = args.log.stat().st_size
            with tempfile.TemporaryDirectory(prefix="aiperf_chat_") as tmp:
                export = run_aiperf(args.aiperf, url, args.model, args.requests, args.concurrency, Path(tmp), extra)
            completed = _metric(export, "request_count", "avg") or 0
            errors = _metric(export, "error_request_count", "avg") or 0
            kinds = {e["error_details"]["type"]: e["count"] for e in export.get("error_summary", [])}
            print(f"| {name} | {args.requests} | {_answered(args.log, since)} | {completed:.0f} "
                  f"| {errors:.0f}{' ' + str(kinds) if kinds else ''} "
                  f"| {_metric(export, 'time_to_first_token', 'p50'):.1f} "
                  f"| {_metric(export, 'time_to_first_token', 'p99'):.1f} "
                  f"| {_metric(export, 'output_token_throughput', 'avg'):.1f} |")
            clean = clean and completed == args.requests and errors == 0
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
