"""SGLang's own `bench_serving` against the embedded server: does every request complete, on both of its backends?

SGLang 0.5.23 cannot be imported beside the study's CPU torch 2.13: its package `__init__` reaches
`sglang.srt.multimodal.internvl_utils`, which imports torchvision, and PyPI's torchvision does not load beside
that torch ('operator torchvision::nms does not exist'). So it runs from an interpreter of its own, a venv with
the torch and torchvision pair that loads together on this disk (a CUDA build that runs on the CPU here):

    python3 -m venv /tmp/sglbench && /tmp/sglbench/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/sglbench/bin/pip install --no-deps sglang==0.5.23
    /tmp/sglbench/bin/pip install aiohttp msgspec orjson numpy requests tqdm pybase64 pillow ipython datasets \
        pyzmq psutil starlette apache-tvm-ffi sentencepiece compressed-tensors gguf transformers==5.19.0 \
        tokenizers==0.23.2
    python -m benchmarks.sglang_bench_serving --sglang-python /tmp/sglbench/bin/python \
        --model results/embedded-cpu/models/target [--requests 16 --concurrency 4]

It starts the embedded server twice, with cumulative and with incremental streaming (`--incremental-streaming-output`),
and against each runs `python -m sglang.bench_serving` with `--backend sglang` (/generate) and `--backend
sglang-oai` (/v1/completions) on its `random-ids` dataset (random token ids: no download). It prints, per run,
the requests completed, the errors bench_serving recorded, the output tokens it counted and those of the text it
assembled from the stream (retokenized: a stream read wrongly shows here), output tok/s and TTFT, and exits 1
unless every request of every run completed without error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

BACKENDS = ("sglang", "sglang-oai")


def run_bench(python: str, backend: str, url: str, model: Path, requests: int, concurrency: int,
              out: Path) -> dict:
    """bench_serving's result line for one run (its `--output-file`, with `--output-details` for the errors)."""
    argv = [python, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url, "--model", str(model),
            "--tokenizer", str(model), "--dataset-name", "random-ids", "--random-input-len", "32",
            "--random-output-len", "16", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--seed", "0", "--output-file", str(out), "--output-details", "--disable-tqdm"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"bench_serving --backend {backend} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-python", required=True, help="an interpreter that imports sglang.bench_serving")
    parser.add_argument("--model", type=Path, required=True, help="target model dir (served and the tokenizer)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be >= 1")
    model = args.model.resolve()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sglang_bench_serving_") as tmp:
        for incremental in (False, True):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            spec = ServerSpec("embedded", str(model), None, "127.0.0.1", 64, 0, incremental_streaming=incremental)
            mode = "incremental" if incremental else "cumulative"
            with ServerProcess(build_command(spec, {}, port), Path(tmp) / f"server-{mode}.log", url, 300):
                for backend in BACKENDS:
                    result = run_bench(args.sglang_python, backend, url, model, args.requests, args.concurrency,
                                       Path(tmp) / f"{mode}-{backend}.jsonl")
                    errors = [e for e in result["errors"] if e]
                    failed += args.requests - result["completed"] + len(errors)
                    print(f"{mode} streaming, --backend {backend}: {result['completed']}/{args.requests} completed, "
                          f"{len(errors)} errors{f' (first: {errors[0]!r})' if errors else ''}; "
                          f"{result['total_output_tokens']} output tokens, "
                          f"{result['total_output_tokens_retokenized']} in its retokenized text; output "
                          f"{result['output_throughput']:.0f} tok/s, median TTFT {result['median_ttft_ms']:.0f} ms",
                          flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
