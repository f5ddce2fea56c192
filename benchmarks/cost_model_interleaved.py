"""The cost model against cells measured side by side: every setting's cell at a concurrency runs back to back,
round after round, so a change in machine load hits all settings alike (a study measures one setting after the
other, minutes apart, and on a shared machine the load drifts between them).

Fits the model (workflow_scripts/analysis/cost_model/, unchanged) on baseline + steps 1..--fit-max, predicts the
larger steps, then reports the leave-one-setting-out errors over every measured speculative setting and the
prediction errors of the steps it never saw. The engine runs in-process (no HTTP), T=0 random-id prompts with
ignore_eos, as the synthetic workload.

    python -m benchmarks.cost_model_interleaved --target results/cost-model/models/target \
        --draft results/cost-model/models/draft --steps 1 2 3 4 5 --fit-max 3 --concurrency 1 4 16 64 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from benchmarks.engine_bench import aggregate_tok_s, make_prompts
from workflow_scripts.analysis.cost_model.report import analyse
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import MEASURED
from workflow_scripts.engine.closed_loop import run_cell
from workflow_scripts.engine.scheduler import Scheduler
from workflow_scripts.engine.types import SamplingParams, SpecConfig


def study_config(steps: list[int], predict_max: int) -> StudyConfig:
    spec = {f"steps{k}": {"speculative_algorithm": "STANDALONE", "speculative_num_steps": k,
                          "speculative_eagle_topk": 1, "speculative_num_draft_tokens": k + 1} for k in steps}
    return StudyConfig.from_dict({"settings": {"baseline": {}, **spec}, "analysis": {"predict_max_steps": predict_max}})


def measure(args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests with histograms, cells with aggregate tok/s per round), all settings interleaved per round."""
    max_c = max(args.concurrency)
    settings = {"baseline": None} | {f"steps{k}": SpecConfig("STANDALONE", k, 1, k + 1, args.draft) for k in args.steps}
    engines = {name: Scheduler(args.target, spec, max_c, 0, num_threads=1) for name, spec in settings.items()}
    for engine in engines.values():
        engine.start()
    prompts = make_prompts(args.target, max(max_c, 8), realistic=False, vocab=engines["baseline"].vocab_size)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    requests, cells = [], []
    try:
        for name, engine in engines.items():  # warm-up
            run_cell(engine, prompts[:2], params, 2)
        rng = np.random.default_rng(0)
        for rnd in tqdm(range(args.rounds), desc="rounds"):
            for c in args.concurrency:
                for name in rng.permutation(list(engines)):
                    cell = run_cell(engines[name], prompts[: max(c, 8)], params, c)
                    cells.append({"setting": name, "concurrency": c, "repeat": rnd, "aggregate_tok_s": aggregate_tok_s(cell),
                                  "per_request_tok_s": float(np.median([r.decode_tok_s for r in cell]))})
                    for i, r in enumerate(cell):
                        hist = list(r.final.spec_correct_drafts_histogram) or None
                        requests.append({"setting": name, "workload": "synthetic", "concurrency": c, "repeat": rnd,
                                         "request_id": f"{name}-{c}-{rnd}-{i}", "ok": True, "warmup": False,
                                         "temperature": 0.0, "spec_verify_ct": r.final.spec_verify_ct or None,
                                         "spec_correct_drafts_histogram": hist})
    finally:
        for engine in engines.values():
            engine.stop()
    return pd.DataFrame(requests), pd.DataFrame(cells)


def summary_of(cells: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (setting, c), g in cells.groupby(["setting", "concurrency"]):
        agg = g["aggregate_tok_s"]
        rows.append({"source": MEASURED, "setting": setting, "workload": "synthetic", "concurrency": c,
                     "aggregate_tok_s_median": agg.median(), "aggregate_tok_s_ci_low": agg.min(),
                     "aggregate_tok_s_ci_high": agg.max(), "per_request_tok_s_median": g["per_request_tok_s"].median(),
                     "accept_length_mean": np.nan})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--fit-max", type=int, default=3, help="fit on steps up to this, predict the rest")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    requests, cells = measure(args)
    summary = summary_of(cells)
    spread = (summary["aggregate_tok_s_ci_high"] - summary["aggregate_tok_s_ci_low"]) / summary["aggregate_tok_s_median"]
    print(summary.pivot(index="concurrency", columns="setting", values="aggregate_tok_s_median").round(1).to_string())
    print(f"\nspread between rounds (max-min over median): median {100 * spread.median():.1f}%, max {100 * spread.max():.1f}%")
    full = analyse(requests, summary, study_config(args.steps, max(args.steps)))
    errors = full.validation["aggregate_error_pct"].abs()
    print(f"\nleave-one-setting-out over steps {args.steps}: |error| median {errors.median():.1f}%, "
          f"p80 {errors.quantile(0.8):.1f}%, {100 * (errors <= 10).mean():.0f}% of {len(errors)} cells within 10%")
    print(full.validation[["left_out", "concurrency", "measured_aggregate_tok_s", "predicted_aggregate_tok_s",
                           "aggregate_error_pct"]].round(1).to_string(index=False))
    fit_steps = [k for k in args.steps if k <= args.fit_max]
    fit_settings = {"baseline", *(f"steps{k}" for k in fit_steps)}
    fitted = analyse(requests[requests["setting"].isin(fit_settings)], summary[summary["setting"].isin(fit_settings)],
                     study_config(fit_steps, max(args.steps)))
    pred = fitted.predictions[fitted.predictions["steps"] > args.fit_max][["concurrency", "steps",
                                                                          "predicted_aggregate_tok_s",
                                                                          "stated_error_pct"]]
    truth = summary.assign(steps=summary["setting"].str.replace("steps", "").replace("baseline", "0").astype(int))
    both = pred.merge(truth[["concurrency", "steps", "aggregate_tok_s_median"]], on=["concurrency", "steps"])
    both["error_pct"] = 100 * (both["predicted_aggregate_tok_s"] / both["aggregate_tok_s_median"] - 1)
    inside = (both["error_pct"].abs() <= both["stated_error_pct"]).sum()
    print(f"\nfitted on steps {fit_steps} (stated error ±{both['stated_error_pct'].min():.1f}–"
          f"{both['stated_error_pct'].max():.1f}%), predicting the rest:")
    print(both.round(1).to_string(index=False))
    print(f"{inside}/{len(both)} inside the stated error; {(both['error_pct'].abs() <= 10).sum()}/{len(both)} within 10%")
    print("\n" + fitted.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
