"""The measured end-to-end effect of the tuned MoE config, beside the roofline's prediction of it.

For each pair of settings that differ only in `moe_config` (tuned vs default), and each workload and
concurrency, the tuned/default ratio of aggregate tok/s paired by round, with its 95% CI and verdict against the
A/A noise floor (the `moe_ab` rows of tables/improvement.csv, analysis/paired.py). The forward that decodes at
concurrency C carries C·(draft tokens per step) tokens, which fixes the batch size whose roofline
verdict is the prediction. "agrees": a memory-bound prediction sees no measurable difference (the
interval spans 1); a compute-bound one only says tuning *can* help (the default may already be the
best config), so it agrees unless the tuned config measured slower, which no prediction allows.

CLI: python -m workflow_scripts.moe.ab --improvement tables/improvement.csv --roofline moe/roofline.csv
     --pair baseline:baseline_moe_default:1 ... --out moe/ab_vs_roofline.csv --plot moe/ab_vs_roofline.svg
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from workflow_scripts.io import atomic_write_text
from workflow_scripts.moe.model_shapes import MoeShape
from workflow_scripts.moe.roofline import Device, roofline_row

_NEEDED = ("source", "kind", "baseline", "candidate", "workload", "concurrency", "metric", "baseline_value",
           "candidate_value", "improvement_pct", "ci_low_pct", "ci_high_pct", "verdict")
MOE_AB = "moe_ab"  # the improvement kind of (default, tuned) pairs


def moe_pairs(settings: dict[str, dict]) -> list[tuple[str, str, int]]:
    """(tuned, default, tokens per sequence per forward) for settings equal but for moe_config."""
    def rest(s: dict) -> dict:
        return {k: v for k, v in s.items() if k != "moe_config"}

    pairs = []
    for tuned, ts in settings.items():
        if ts.get("moe_config") != "tuned":
            continue
        for default, ds in settings.items():
            if ds.get("moe_config", "default") == "default" and rest(ds) == rest(ts):
                tokens = ts.get("speculative_num_draft_tokens") or 1
                pairs.append((tuned, default, int(tokens)))
    return pairs


def _shape_and_device(roofline: pd.DataFrame) -> tuple[MoeShape, Device]:
    """Rebuild the roofline's shape and device from its first row (one shape and device per study)."""
    row = roofline.iloc[0]
    dtype = row.weight_dtype
    float_dtype = dtype in ("float32", "float16", "bfloat16")
    shape = MoeShape(architecture="", num_experts=int(row.E), shard_n=int(row.N), hidden_size=int(row.hidden_size),
                     top_k=int(row.top_k), act_dtype=dtype if float_dtype else "bfloat16",
                     kernel_dtype=None if float_dtype else dtype, block_shape=None, num_layers=0)
    return shape, Device(row.device, float(row.peak_tflops), float(row.mem_bw_gbs), row.device_source)


def ab_table(improvement: pd.DataFrame, roofline: pd.DataFrame, pairs: list[tuple[str, str, int]]) -> pd.DataFrame:
    """One row per pair x workload x concurrency with both measurements, their paired ratio and the prediction."""
    missing = [c for c in _NEEDED if c not in improvement.columns]
    if missing:
        raise ValueError(f"improvement.csv: missing column(s) {missing}")
    ab = improvement[(improvement["source"] == "measured") & (improvement["kind"] == MOE_AB)
                     & (improvement["metric"] == "aggregate_tok_s")]
    shape, device = _shape_and_device(roofline)
    rows = []
    for tuned, default, tokens in pairs:
        sel = ab[(ab["candidate"] == tuned) & (ab["baseline"] == default)].sort_values(["workload", "concurrency"])
        for r in sel.itertuples():
            ratio, low, high = (1 + x / 100 for x in (r.improvement_pct, r.ci_low_pct, r.ci_high_pct))
            M = int(r.concurrency) * tokens
            pred = roofline_row(shape, device, M)
            no_difference = r.verdict != "real"
            memory_bound = pred["verdict"].startswith("memory")
            rows.append({
                "tuned_setting": tuned, "default_setting": default, "workload": r.workload,
                "concurrency": int(r.concurrency), "tokens_per_forward": M,
                "tuned_tok_s": r.candidate_value, "default_tok_s": r.baseline_value,
                "ratio": ratio, "ratio_ci_low": low, "ratio_ci_high": high,
                "measured": "no measurable difference" if no_difference else ("tuned faster" if low > 1 else "tuned slower"),
                "intensity_flop_per_byte": pred["intensity_flop_per_byte"],
                "ridge_flop_per_byte": pred["ridge_flop_per_byte"],
                "predicted": pred["verdict"],
                "agrees": bool(no_difference if memory_bound else high >= 1),
            })
    if not rows:
        raise ValueError(f"improvement.csv has no measured {MOE_AB} rows for any pair {pairs}")
    return pd.DataFrame(rows)


def ab_chart(table: pd.DataFrame):
    """Tuned/default ratio with its interval per concurrency, colored by the roofline's prediction."""
    import altair as alt

    base = alt.Chart(table).encode(x=alt.X("concurrency:O", title="concurrency"))
    bars = base.mark_rule().encode(y=alt.Y("ratio_ci_low:Q", title="tuned / default aggregate tok/s"), y2="ratio_ci_high:Q")
    points = base.mark_point(filled=True, size=60).encode(
        y="ratio:Q", color=alt.Color("predicted:N", title="roofline predicts"),
        tooltip=["workload", "concurrency", "tokens_per_forward", "ratio", "ratio_ci_low", "ratio_ci_high", "predicted"],
    )
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q")
    return alt.layer(bars, points, one, data=table).properties(width=220, height=220).facet(
        column=alt.Column("workload:N"), row=alt.Row("tuned_setting:N", title=None)
    ).properties(title="MoE A/B: tuned vs default kernel config, end to end")


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the A/B rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--improvement", type=Path, required=True, help="the study's tables/improvement.csv")
    parser.add_argument("--roofline", type=Path, required=True)
    parser.add_argument("--pair", action="append", required=True, help="TUNED:DEFAULT:TOKENS_PER_SEQUENCE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args(argv)
    pairs = []
    for spec in args.pair:
        parts = spec.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            parser.error(f"--pair {spec!r}: expected TUNED:DEFAULT:TOKENS")
        pairs.append((parts[0], parts[1], int(parts[2])))
    table = ab_table(pd.read_csv(args.improvement), pd.read_csv(args.roofline), pairs)
    atomic_write_text(args.out, table.to_csv(index=False))
    import vl_convert as vlc

    atomic_write_text(args.plot, vlc.vegalite_to_svg(ab_chart(table).to_json()))
    print(table[["tuned_setting", "workload", "concurrency", "ratio", "ratio_ci_low", "ratio_ci_high", "measured",
                 "predicted", "agrees"]].to_string(index=False))


if __name__ == "__main__":
    main()
