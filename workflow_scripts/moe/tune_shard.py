"""One tuning shard: the best fused-MoE config at each of a few batch sizes, on one device.

Engine `embedded` times the embedded engine's kernel on this CPU; engine `sglang` runs SGLang's
patched tuner on one GPU. Both write the same shard record, atomically, so a crashed shard leaves
nothing behind and a rerun redoes only it.

CLI: python -m workflow_scripts.moe.tune_shard --engine embedded|sglang --model DIR --shard I --shards N
     --batch-sizes 1 2 4 ... --search halving --out shards/I.json [engine-specific flags]
"""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from pathlib import Path

from workflow_scripts.io import atomic_write_json
from workflow_scripts.moe.model_shapes import read_moe_shape
from workflow_scripts.moe.naming import triton_version_dir
from workflow_scripts.moe.search import SEARCHES

EXHAUSTIVE_REPEATS = 10  # samples per config in the exhaustive CPU search


def shard_batch_sizes(batch_sizes: list[int], shard: int, shards: int) -> list[int]:
    """Batch sizes of one shard: striped, so each shard gets small and large ones (balanced cost)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is outside 0..{shards - 1}")
    return sorted(batch_sizes)[shard::shards]


def tune_embedded(model: Path, batch_sizes: list[int], search: str, seed: int, threads: int | None) -> dict:
    """The CPU shard record for the embedded engine."""
    import torch

    from workflow_scripts.engine import fused_moe as engine_moe
    from workflow_scripts.moe.tune_cpu import load_layer_weights, tune

    if threads:
        torch.set_num_threads(threads)
    shape = read_moe_shape(model)
    weights = load_layer_weights(model, shape, seed)
    results = tune(weights, shape, batch_sizes, search, EXHAUSTIVE_REPEATS, seed)
    device = engine_moe.device_name()
    return {
        "file_name": engine_moe.config_file_name(shape.num_experts, shape.shard_n, device),
        "device_name": device,
        "version_dir": engine_moe.ENGINE_VERSION_DIR,
        "shape": shape.to_dict(),
        "weights": weights.source,
        "threads": torch.get_num_threads(),
        "results": {str(M): r for M, r in results.items()},
    }


def tune_sglang(args: argparse.Namespace, batch_sizes: list[int]) -> dict:
    """The GPU shard record: SGLang's tuner per batch size on a GPU slot of our own."""
    from workflow_scripts.moe.patch_tuner import TUNER_SCRIPT, tuner_flags
    from workflow_scripts.moe.sglang_tuner import gpu_slot, tune_shard_sglang

    script = args.tuner_dir / TUNER_SCRIPT
    if not script.is_file():
        raise FileNotFoundError(f"--tuner-dir {args.tuner_dir}: no {TUNER_SCRIPT} (run the patch rule first)")
    if args.search == "halving" and "--search-space-file" not in tuner_flags(script):
        raise SystemExit(f"moe.search: halving needs the tuner's --search-space-file, which {script} lacks "
                         "(older SGLang); set moe.search: exhaustive")
    shape = read_moe_shape(args.model, args.tp_size, args.ep_size)
    # Under Slurm the job already owns the GPU it was given (CUDA_VISIBLE_DEVICES is set): locks on the shared
    # filesystem would serialise every shard of the cluster on one file.
    slot = nullcontext(None) if "SLURM_JOB_ID" in os.environ else gpu_slot(
        args.lock_dir, args.gpus, args.shard % args.gpus, args.timeout_s)
    with slot as gpu:
        record = tune_shard_sglang(
            python=args.python, tuner_dir=args.tuner_dir, model=str(args.model), shape=shape,
            tp_size=args.tp_size, ep_size=args.ep_size, batch_sizes=batch_sizes, search=args.search,
            seed=args.seed, gpu=gpu, timeout_s=args.timeout_s,
        )
    record["version_dir"] = triton_version_dir(record["triton_version"])
    record["shape"] = shape.to_dict()
    record["results"] = {str(M): r for M, r in record["results"].items()}
    return record


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the tune-shard rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("embedded", "sglang"), required=True)
    parser.add_argument("--model", type=Path, required=True, help="model dir (or config.json) whose MoE layer is tuned")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True, help="all of moe.batch_sizes")
    parser.add_argument("--search", choices=SEARCHES, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None, help="embedded: torch threads")
    parser.add_argument("--python", default="python", help="sglang: interpreter with sglang installed")
    parser.add_argument("--tuner-dir", type=Path, help="sglang: the patched tuner dir")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--ep-size", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=1, help="sglang: GPU slots to share among shards")
    parser.add_argument("--lock-dir", type=Path, help="sglang: where the GPU slot locks live")
    parser.add_argument("--timeout-s", type=float, default=6 * 3600, help="sglang: bound per tuner run and slot wait")
    args = parser.parse_args(argv)

    batch_sizes = shard_batch_sizes(args.batch_sizes, args.shard, args.shards)
    if not batch_sizes:
        raise SystemExit(f"shard {args.shard} of {args.shards} has no batch sizes (moe.shards > len(moe.batch_sizes)?)")
    if args.engine == "embedded":
        record = tune_embedded(args.model, batch_sizes, args.search, args.seed, args.threads)
    else:
        if args.tuner_dir is None or args.lock_dir is None:
            parser.error("--engine sglang needs --tuner-dir and --lock-dir")
        record = tune_sglang(args, batch_sizes)
    record.update(engine=args.engine, shard=args.shard, shards=args.shards, search=args.search, batch_sizes=batch_sizes)
    atomic_write_json(args.out, record)
    print(f"shard {args.shard}: {record['file_name']} for batch sizes {batch_sizes}")


if __name__ == "__main__":
    main()
