"""Command line: the cost model of a finished study, with predictions for step counts it did not measure.

    python -m workflow_scripts.analysis.cost_model --study results/embedded-cpu --predict-steps 4 5 \
        [--leave-out steps4 steps5 --out predicted.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

import pandas as pd

from workflow_scripts.analysis.cost_model.report import analyse
from workflow_scripts.analysis.noise import read_noise_floor
from workflow_scripts.analysis.output import write_csv
from workflow_scripts.analysis.study_inputs import PROFILE_FILE, load_study, read_study_config, study_files
from workflow_scripts.analysis.summarize import summarize_external, summarize_measured

NOISE_FLOOR_FILE = "noise_floor.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True, help="results/{study}: reads requests/*.parquet")
    parser.add_argument("--config-json", default=None, help="study config as JSON (default: metadata/study.json)")
    parser.add_argument("--predict-steps", type=int, nargs="*", default=None,
                        help="print these step counts (default: 1..analysis.predict_max_steps)")
    parser.add_argument("--out", type=Path, default=None, help="also write the predictions as CSV here")
    parser.add_argument("--forward-profile", type=Path, default=None,
                        help=f"the engine's forward profile (default: {PROFILE_FILE} in the study, where present)")
    parser.add_argument("--linear-step-cost", action="store_true",
                        help="fit the step cost linear in the drafts even where a forward profile exists (to compare)")
    parser.add_argument("--leave-out", nargs="+", default=[], metavar="SETTING",
                        help="fit and predict as if these settings had not been measured (a prediction to check "
                             "against them afterwards)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        cfg = read_study_config(args.study, args.config_json)
        if unknown := sorted(set(args.leave_out) - set(cfg.settings)):
            raise ValueError(f"--leave-out: {', '.join(unknown)} not among the study's settings")
        cfg = dataclasses.replace(cfg, settings={k: v for k, v in cfg.settings.items() if k not in args.leave_out})
        if args.predict_steps:
            cfg = dataclasses.replace(cfg, predict_max_steps=max(cfg.predict_max_steps, *args.predict_steps))
        files = study_files(args.study)
        profile = None if args.linear_step_cost else args.forward_profile or files.profile
        study = load_study(cfg, files.requests, profile_path=profile, profile_required=bool(args.forward_profile))
        # the A/A twin is the control again; left-out settings were never measured, as far as the fit knows
        study = study.without([cfg.twin, *args.leave_out])
        summary = pd.concat([summarize_measured(study.requests, study.cells, cfg.bootstrap),
                             summarize_external(study.external)], ignore_index=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    floor, floor_text = read_noise_floor(args.study / "tables" / NOISE_FLOOR_FILE)
    report = analyse(study.requests, summary, cfg, floor, floor_text, study.cells, study.profile)
    print(report.markdown)
    pred = report.predictions
    if args.predict_steps:
        pred = pred[pred["steps"].isin(args.predict_steps)]
    if len(pred):
        shown = pred[["source", "workload", "concurrency", "steps", "predicted_aggregate_tok_s", "stated_error_pct",
                      "predicted_per_request_tok_s", "measured_aggregate_tok_s", "note"]]
        print(shown.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    if args.out:
        write_csv(pred, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
