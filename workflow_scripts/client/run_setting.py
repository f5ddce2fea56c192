"""The benchmark job of one setting: launch its server, measure every missing cell, write requests/{setting}.parquet.

Each finished cell is cached under `cells/{setting}/` by a key of everything that shapes it (server args, model
and MoE-config fingerprints, workload, cell size, repeat), so a job re-run after a config edit measures only new
cells. A cell is cached only after the server proved alive at its end, so a crash never leaves a cell that looks
complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from workflow_scripts.client.cell import CellPlan, CellResult, run_cell, sampling_params
from workflow_scripts.client.prompts import build_prompts
from workflow_scripts.launcher.command import ServerSpec, build_command
from workflow_scripts.launcher.process import ServerProcess, free_port

log = logging.getLogger("benchmark")

RECORD_SCHEMA = pa.schema(
    [
        ("setting", pa.string()),
        ("workload", pa.string()),
        ("concurrency", pa.int64()),
        ("repeat", pa.int64()),
        ("request_id", pa.string()),
        ("prompt_id", pa.int64()),
        ("warmup", pa.bool_()),
        ("temperature", pa.float64()),
        ("send_ts", pa.float64()),
        ("first_token_ts", pa.float64()),
        ("chunk_ts", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int64())),
        ("end_ts", pa.float64()),
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        ("spec_verify_ct", pa.int64()),
        ("accept_length", pa.float64()),
        ("spec_correct_drafts_histogram", pa.list_(pa.int64())),
        ("spec_num_correct_drafts", pa.int64()),
        ("spec_num_proposed_drafts", pa.int64()),
        ("output_ids", pa.list_(pa.int64())),
        ("text_hash", pa.string()),
        ("error", pa.string()),
        ("cell_wall_s", pa.float64()),
        ("cell_client_cpu_s", pa.float64()),
    ]
)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_fingerprint(target: Path, draft: Path | None, engine: str) -> dict:
    """Embedded pairs are small: hash their weights. SGLang checkpoints are huge: their paths stand in."""
    if engine != "embedded":
        return {"target": str(target), "draft": str(draft)}
    return {name: sha256_file(d / "model.safetensors") for name, d in (("target", target), ("draft", draft)) if d}


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pandas(df, schema=RECORD_SCHEMA, preserve_index=False), tmp)
    os.replace(tmp, path)


def cell_frame(result: CellResult, setting: str, workload: str, wl: dict, concurrency: int, repeat: int) -> pd.DataFrame:
    rows = [r.as_row() for r in result.records]
    df = pd.DataFrame(rows)
    df.insert(0, "setting", setting)
    df.insert(1, "workload", workload)
    df.insert(2, "concurrency", concurrency)
    df.insert(3, "repeat", repeat)
    df["warmup"] = df["request_id"].isin(result.warmup_ids)
    df["temperature"] = float(wl["temperature"])
    df["cell_wall_s"] = result.wall_s
    df["cell_client_cpu_s"] = result.client_cpu_s
    return df[RECORD_SCHEMA.names]


class Cell(NamedTuple):
    """One cell to measure, and where its cached records live."""

    workload: str
    spec: dict  # the workload's config
    concurrency: int
    repeat: int
    plan: CellPlan
    path: Path


def server_spec(plan: dict, target: Path, draft: Path | None, threads: int) -> ServerSpec:
    server = plan["server"]
    common = dict(
        engine=plan["engine"],
        model_path=str(target),
        draft_path=str(draft) if draft else None,
        host=server["host"],
        max_running_requests=server["max_running_requests"],
        random_seed=server["random_seed"],
    )
    if plan["engine"] == "embedded":
        return ServerSpec(num_threads=server["num_threads"] or threads, **common)
    sg = plan["sglang"]
    return ServerSpec(
        sglang_python=sg["python"],
        tp_size=sg["tp_size"],
        mem_fraction_static=sg["mem_fraction_static"],
        **common,
    )


def server_env(plan: dict, installed: dict | None) -> dict[str, str | None]:
    """`moe_config: tuned` points the server at the installed configs; `default` makes sure it sees none."""
    env: dict[str, str | None] = dict(plan["server"]["env"])
    env["SGLANG_MOE_CONFIG_DIR"] = installed["config_dir"] if installed else None
    return env


def run(args: argparse.Namespace) -> None:
    plan = json.loads(args.plan)
    setting, setting_args = plan["setting"], plan["args"]
    tuned = setting_args.get("moe_config") == "tuned"
    if tuned and args.moe_installed is None:
        raise SystemExit(f"settings.{setting}.moe_config is tuned but no --moe-installed file was given")
    installed = json.loads(args.moe_installed.read_text()) if tuned else None
    fingerprint = {
        "model": model_fingerprint(args.target, args.draft, plan["engine"]),
        "moe": sha256_file(Path(installed["file"])) if installed else "default",
        "args": setting_args,
        "engine": plan["engine"],
        "api": plan["api"],
        "engine_code": plan["engine_code"],
        # everything about the server that changes what it measures (not e.g. its start-up timeout)
        "server": {k: plan["server"][k] for k in ("max_running_requests", "random_seed", "num_threads", "env")},
    }
    cells = []
    for workload, wl in plan["workloads"].items():
        for c in plan["concurrency"]:
            warmup, measured = plan["cells"][str(c)]
            for repeat in range(plan["repeats"]):
                key_src = json.dumps([fingerprint, workload, wl, c, warmup, measured, repeat], sort_keys=True)
                key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
                path = args.cells_dir / f"{workload}-c{c}-r{repeat}-{key}.parquet"
                cell_plan = CellPlan(c, warmup, measured, plan["api"], plan["request_timeout_s"])
                cells.append(Cell(workload, wl, c, repeat, cell_plan, path))
    todo = [cell for cell in cells if not cell.path.is_file()]
    log.info("setting %s: %d cells, %d cached, %d to measure", setting, len(cells), len(cells) - len(todo), len(todo))
    if todo:
        measure(plan, args, todo, installed)
    frames = [pd.read_parquet(cell.path) for cell in cells]
    write_parquet_atomic(pd.concat(frames, ignore_index=True), args.out)
    log.info("wrote %s", args.out)


def measure(plan: dict, args: argparse.Namespace, todo: list[Cell], installed: dict | None) -> None:
    setting = plan["setting"]
    spec = server_spec(plan, args.target, args.draft, args.threads)
    port = free_port(spec.host)
    argv = build_command(spec, plan["args"], port)
    url = f"http://{spec.host}:{port}"
    prompts = {wl_name: build_prompts(wl, args.target) for wl_name, wl in plan["workloads"].items()}
    env = server_env(plan, installed)
    with ServerProcess(argv, args.server_log, url, plan["server"]["startup_timeout_s"], env) as server:
        if installed:
            from workflow_scripts.moe.verify import check_loaded

            check_loaded(server.log_since_start(), Path(installed["file"]))
        for workload, wl, c, repeat, cell_plan, path in tqdm(todo, desc=f"{setting} cells", unit="cell"):
            tag = f"{setting}-{workload}-c{c}-r{repeat}"
            result = run_cell(url, cell_plan, prompts[workload], sampling_params(wl), tag)
            server.check_alive()
            if len(result.records) != cell_plan.total:
                raise RuntimeError(f"cell {tag}: sent {cell_plan.total} requests but recorded {len(result.records)}")
            df = cell_frame(result, setting, workload, wl, c, repeat)
            write_parquet_atomic(df, path)
            ok = df[~df.warmup & df.error.isna()]
            span = ok.end_ts.max() - ok.send_ts.min() if len(ok) else float("nan")
            log.info(
                "cell %s: %d ok, %d errors, aggregate %.1f tok/s, client CPU %.0f%% of one core",
                tag, len(ok), int(df.error.notna().sum()), ok.output_tokens.sum() / span if len(ok) else float("nan"),
                100 * result.client_cpu_s / result.wall_s,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="JSON from workflow_scripts.client.plan.plan_json")
    parser.add_argument("--target", type=Path, required=True, help="target model dir (or SGLang model path)")
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--moe-installed", type=Path, default=None, help="installed.json of the MoE install rule")
    parser.add_argument("--cells-dir", type=Path, required=True)
    parser.add_argument("--server-log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    run(args)


if __name__ == "__main__":
    main()
