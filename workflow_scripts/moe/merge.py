"""Merge the shard records into one tuned config in SGLang's format, refusing inconsistent shards.

CLI: python -m workflow_scripts.moe.merge --shards shards/0.json ... --batch-sizes 1 2 ... --out merged.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workflow_scripts.io import atomic_write_json

# Every shard must agree on these, or their configs do not belong in one file.
_SAME = ("engine", "file_name", "device_name", "version_dir", "search")


def merge_shards(records: dict[Path, dict], batch_sizes: list[int]) -> dict:
    """One merged record: {"file_name", ..., "configs": {"M": config}, "per_batch_size": {"M": details}}."""
    if not records:
        raise ValueError("no shard records to merge")
    first_path, first = next(iter(records.items()))
    for path, rec in records.items():
        for key in _SAME:
            if rec.get(key) != first.get(key):
                raise ValueError(f"{path}: {key} is {rec.get(key)!r} but {first_path} has {first.get(key)!r}")
    per_batch: dict[str, dict] = {}
    for path, rec in records.items():
        for M, result in rec["results"].items():
            if M in per_batch:
                raise ValueError(f"{path}: batch size {M} is tuned by more than one shard")
            per_batch[M] = {**result, "shard": rec["shard"]}
    missing = sorted(set(map(str, batch_sizes)) - set(per_batch), key=int)
    extra = sorted(set(per_batch) - set(map(str, batch_sizes)), key=int)
    if missing or extra:
        raise ValueError(f"shards cover batch sizes {sorted(per_batch, key=int)}; moe.batch_sizes wants {batch_sizes} "
                         f"(missing {missing}, unexpected {extra}): rerun the shards after changing moe.batch_sizes")
    order = sorted(per_batch, key=int)
    return {
        **{key: first[key] for key in _SAME},
        "shape": first.get("shape"),
        "configs": {M: per_batch[M]["config"] for M in order},
        "per_batch_size": {M: per_batch[M] for M in order},
    }


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the merge rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, nargs="+", required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    merged = merge_shards({p: json.loads(p.read_text()) for p in args.shards}, args.batch_sizes)
    atomic_write_json(args.out, merged)
    print(f"merged {len(args.shards)} shards into {merged['file_name']}")


if __name__ == "__main__":
    main()
