"""The deployable step schedule: the steps to run in each batch-size band, per workload, in three forms.

The study decides a winner per concurrency band (recommend.py). A deployment needs the same verdict as batch-size
breakpoints: neighbouring bands meet halfway between their concurrencies on a log scale (band_ranges), the first
from batch 1, the last up to `--max-batch`. The steps of a band are its recommendation's, noise-aware:
- the recommendation already breaks score ties toward fewer steps;
- a band whose pick does not beat the baseline beyond noise at every one of its concurrencies (verdict not `real`)
  keeps the baseline's steps (no speculation): an undecided band keeps the fewer-steps choice;
- a pick of another algorithm than the schedule's (one deployment switches one draft's steps) keeps the baseline too;
- where the pick beats the baseline but the study did not tell it apart from another step count of its algorithm
  (no real lead over it at every concurrency of the band), the cost model chooses between them (model_choice): a
  band's pick among settings within the host's round-to-round drift of each other is the noise's, while the model
  pools acceptance and step cost over every cell. The model's choice must beat the baseline too.
The `reason` column says which rule chose each band's steps.

Outputs, per workload, under deploy/{workload}/:
- `sglang_adaptive.json`: SGLang's `--speculative-adaptive-config`, one entry per band whose only candidate is the
  band's steps, so SGLang's batch-size routing (engine/adaptive.py) runs the schedule and its EMA never moves;
- `settings.yaml`: a `settings:` entry with that file, for the next study to measure against the static settings;
- `vllm_speculative_config.json`: vLLM's `--speculative-config` with `num_speculative_tokens_per_batch_size`
  ([first batch, last batch, K] ranges).
SGLang adapts EAGLE/EAGLE3 only: on SGLang, deploy the schedule with an EAGLE draft (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd
import yaml

from workflow_scripts.analysis.output import write_csv
from workflow_scripts.io import atomic_write_text
from workflow_scripts.analysis.paired import REAL
from workflow_scripts.analysis.recommend import band_verdict, measured_between
from workflow_scripts.analysis.study_config import StudyConfig, is_adaptive, is_calibration

SCHEDULE_COLUMNS = ["workload", "band", "batch_from", "batch_to", "concurrencies", "steps", "recommended", "verdict",
                    "reason"]
METRIC = "aggregate_tok_s"  # a deployment serves the batch: its throughput decides
DEPLOY_FILES = ("sglang_adaptive.json", "settings.yaml", "vllm_speculative_config.json")


def bands_problem(bands: dict[str, list[int]]) -> str | None:
    """Bands become breakpoints: each band's concurrencies increasing, and each band above the one before it."""
    previous: tuple[str, int] | None = None
    for name, concs in bands.items():
        if list(concs) != sorted(set(concs)):
            return f"analysis.bands.{name}: concurrencies must be increasing without repeats, got {list(concs)}"
        if previous is not None and concs[0] <= previous[1]:
            return (f"analysis.bands.{name}: starts at {concs[0]}, not above band {previous[0]}'s last concurrency "
                    f"{previous[1]} (bands are listed from the smallest batch up and must not overlap)")
        previous = (name, concs[-1])
    return None


def band_ranges(bands: dict[str, list[int]], max_batch: int) -> list[tuple[str, int, int]]:
    """(band, first batch size, last batch size), bands in the order of their smallest concurrency. Two neighbouring
    bands meet halfway, on a log scale, between the last concurrency of the one and the first of the next
    (band_start): a server measured at concurrency C runs decode batches of C and, whenever a request ends and the
    next one waits for its prefill, of a few less, so a breakpoint at C itself would serve those dips with the band
    below, steps the study never measured at C. The first band serves from batch 1 (a smaller batch than any
    measured takes the nearest band's choice, as SGLang routes it), the last up to `max_batch`, and a band whose
    smallest concurrency is above `max_batch` is dropped first (the server never runs its batches)."""
    kept = sorted(((name, concs) for name, concs in bands.items() if concs[0] <= max_batch),
                  key=lambda band: band[1][0])
    starts = [1, *(band_start(below[-1], above[0]) for (_, below), (_, above) in zip(kept, kept[1:]))]
    return [(name, start, starts[i + 1] - 1 if i + 1 < len(starts) else max_batch)
            for i, ((name, _), start) in enumerate(zip(kept, starts))]


def band_start(below: int, above: int) -> int:
    """The first batch size of a band whose smallest concurrency is `above`, after one whose largest is `below`:
    the geometric mean of the two rounded up, and at least below + 1 (1 and 4 meet at 2, 16 and 32 at 23)."""
    return max(below + 1, math.isqrt(below * above - 1) + 1)


def static_speculative(cfg: StudyConfig) -> dict[str, dict]:
    """The settings a schedule can take its steps from: speculative, static (not adaptive), not calibration."""
    return {name: s for name, s in cfg.settings.items()
            if s.get("speculative_algorithm") and not is_adaptive(s) and not is_calibration(s)}


def scheduled_algorithm(cfg: StudyConfig) -> tuple[str, dict] | None:
    """The speculative setting family the schedule switches: the algorithm with the most settings (first on a tie),
    and the lowest-steps setting of it as the template for the other keys."""
    specs = static_speculative(cfg)
    if not specs:
        return None
    algorithms = [s["speculative_algorithm"] for s in specs.values()]
    algorithm = max(dict.fromkeys(algorithms), key=algorithms.count)
    template = min((n for n, s in specs.items() if s["speculative_algorithm"] == algorithm), key=cfg.steps)
    return algorithm, specs[template]


def model_choice(pick: str, predictions: pd.DataFrame, improvement: pd.DataFrame, cfg: StudyConfig, workload: str,
                 concs: list[int], algorithm: str) -> tuple[str, str] | None:
    """(setting, why) where the cost model's best measured setting of `algorithm` for the band differs from `pick`,
    the study did not show `pick` ahead of it at every concurrency of the band, and it beats the baseline beyond
    noise; None where the pick stands. The model's best: the highest mean predicted aggregate tok/s over the band's
    concurrencies, among the algorithm's measured settings predicted at all of them (fewer steps on a tie)."""
    pred = predictions[(predictions["source"] == "measured") & (predictions["workload"] == workload)
                       & predictions["concurrency"].isin(concs) & predictions["measured"].astype(bool)]
    family = [n for n, s in static_speculative(cfg).items() if s["speculative_algorithm"] == algorithm]
    pred = pred[pred["setting"].isin(family)]
    full = pred.groupby("setting")["concurrency"].nunique() == len(set(concs))
    means = pred[pred["setting"].isin(full[full].index)].groupby("setting")[f"predicted_{METRIC}"].mean()
    if pick not in means.index:
        return None
    best = min(means.index, key=lambda name: (-means[name], cfg.steps(name)))
    if best == pick or band_verdict(improvement, cfg, best, workload, METRIC, concs) != REAL:
        return None
    rows = measured_between(improvement, pick, best, workload, METRIC, concs)
    ahead = (rows["candidate"] == pick) == (rows["improvement_pct"] > 0)
    if set(rows["concurrency"]) == set(concs) and bool(((rows["verdict"] == REAL) & ahead).all()):
        return None
    shown = "; ".join(f"C={r.concurrency} {r.candidate} vs {r.baseline} {r.improvement_pct:+.1f}% ({r.verdict})"
                      for r in rows.sort_values("concurrency").itertuples()) or "not compared"
    gain = 100 * (means[best] / means[pick] - 1)
    return best, (f"{pick} ({cfg.steps(pick)} steps) scores best but is not shown ahead of {best} ({cfg.steps(best)} "
                  f"steps) at every concurrency of the band ({shown}); the cost model predicts {best} {gain:+.1f}% "
                  f"over it here, and {best} beats {cfg.baseline} beyond noise")


def step_schedule(recommendation: pd.DataFrame, cfg: StudyConfig, max_batch: int, improvement: pd.DataFrame,
                  predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per workload × band: the band's batch sizes, its steps and why."""
    family = scheduled_algorithm(cfg)
    rows = []
    rec = recommendation[recommendation["metric"] == METRIC].set_index(["workload", "band"])
    for workload in cfg.workloads:
        for band, lo, hi in band_ranges(cfg.bands, max_batch):
            row = {"workload": workload, "band": band, "batch_from": lo, "batch_to": hi,
                   "concurrencies": " ".join(map(str, cfg.bands[band]))}
            pick = rec.loc[(workload, band)] if (workload, band) in rec.index else None
            name = "" if pick is None or pd.isna(pick["recommended"]) else str(pick["recommended"])
            verdict = "" if pick is None or pd.isna(pick["verdict"]) else str(pick["verdict"])
            steps, reason = 0, ""
            if not name:
                reason = "no eligible setting measured in this band: no speculation"
            elif is_calibration(cfg.settings.get(name, {})):
                reason = f"{name} is a calibration setting (fixed acceptance, not the model's output): no speculation"
            elif cfg.steps(name) == 0:
                reason = f"{name} (no speculation) scores best"
            elif family is None or cfg.settings[name].get("speculative_algorithm") != family[0]:
                reason = f"{name} is not a {family[0] if family else 'speculative'} setting: no speculation kept"
            elif verdict != REAL:
                reason = (f"{name} ({cfg.steps(name)} steps) is not decided against {cfg.baseline} "
                          f"(verdict: {verdict or 'none'}): the fewer-steps choice, no speculation, is kept")
            elif chosen := model_choice(name, predictions, improvement, cfg, workload, cfg.bands[band], family[0]):
                steps, reason = cfg.steps(chosen[0]), chosen[1]
            else:
                steps = cfg.steps(name)
                tied = "" if pick is None or pd.isna(pick["tied_with"]) or not pick["tied_with"] else (
                    f"; tied within tolerance with {pick['tied_with']}, fewer steps kept")
                reason = f"{name} beats {cfg.baseline} beyond noise at every concurrency of the band{tied}"
            rows.append({**row, "steps": steps, "recommended": name, "verdict": verdict, "reason": reason})
    return pd.DataFrame(rows, columns=SCHEDULE_COLUMNS)


def sglang_adaptive_config(bands: pd.DataFrame) -> dict:
    """SGLang's adaptive config: one batch-size entry per band, its steps the only candidate."""
    return {str(r.batch_from): {"candidate_steps": [int(r.steps)]} for r in bands.itertuples()}


def schedule_setting(bands: pd.DataFrame, template: dict, config_path: str) -> dict:
    """A settings entry that runs the schedule: the template's algorithm and draft, adaptive over the bands' tiers,
    starting on the first band's steps (SGLang wants the start among the tiers; a setting's steps are >= 1, so a
    first band of 0 starts on the smallest positive tier). With no band speculating it is a plain setting."""
    keep = {k: template[k] for k in ("moe_config", "max_running_requests") if template.get(k) is not None}
    positive = sorted(int(s) for s in bands["steps"] if s > 0)
    if not positive:
        return keep
    first = int(bands["steps"].iloc[0])
    start = first if first > 0 else positive[0]
    keep.update({k: template[k] for k in ("speculative_algorithm", "speculative_draft_model_path") if template.get(k)})
    return {**keep, "speculative_num_steps": start, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": start + 1,
            "speculative_adaptive": True, "speculative_adaptive_config": config_path}


def vllm_speculative_config(bands: pd.DataFrame, algorithm: str) -> dict:
    """vLLM's dynamic speculative decoding: [first batch, last batch, K] per band, K at most num_speculative_tokens."""
    return {"method": "draft_model" if algorithm == "STANDALONE" else algorithm.lower(),
            "num_speculative_tokens": max(1, int(bands["steps"].max())),
            "num_speculative_tokens_per_batch_size": [[int(r.batch_from), int(r.batch_to), int(r.steps)]
                                                     for r in bands.itertuples()]}


def write_deploy(schedule: pd.DataFrame, cfg: StudyConfig, deploy_dir: Path) -> None:
    """The three deployment files of every workload (each written whole, then renamed into place)."""
    family = scheduled_algorithm(cfg)
    algorithm, template = family if family else ("STANDALONE", {"speculative_algorithm": "STANDALONE"})
    for workload, bands in schedule.groupby("workload", sort=False):
        out = deploy_dir / str(workload)
        out.mkdir(parents=True, exist_ok=True)
        config_path = out / DEPLOY_FILES[0]
        atomic_write_text(config_path, json.dumps(sglang_adaptive_config(bands), indent=2) + "\n")
        why = "".join(f"# {r.band} (batch {r.batch_from}-{r.batch_to}): {r.steps} steps; {r.reason}\n"
                      for r in bands.itertuples())
        setting = {"settings": {f"schedule_{workload}": schedule_setting(bands, template, str(config_path))}}
        atomic_write_text(out / DEPLOY_FILES[1], why + yaml.safe_dump(setting, sort_keys=False))
        atomic_write_text(out / DEPLOY_FILES[2], json.dumps(vllm_speculative_config(bands, algorithm), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recommendation", type=Path, required=True, help="tables/recommendation.csv")
    p.add_argument("--improvement", type=Path, required=True, help="tables/improvement.csv (the paired verdicts)")
    p.add_argument("--predictions", type=Path, required=True, help="tables/cost_model_predictions.csv")
    p.add_argument("--config-json", required=True, help="the study config (settings, workloads, analysis) as JSON")
    p.add_argument("--max-batch", type=int, required=True, help="the last band's last batch size")
    p.add_argument("--out-csv", type=Path, required=True, help="tables/step_schedule.csv")
    p.add_argument("--deploy-dir", type=Path, required=True, help="results/{study}/deploy")
    p.add_argument("--summary", type=Path, help="tables/summary.csv: draw the schedule over its throughput curves")
    p.add_argument("--plot-dir", type=Path, help="where step_schedule.html and .svg go (with --summary)")
    args = p.parse_args(argv)
    cfg = StudyConfig.from_dict(json.loads(args.config_json))
    if problem := bands_problem(dict(sorted(cfg.bands.items(), key=lambda item: item[1][0]))):
        print(problem, file=sys.stderr)
        return 2
    schedule = step_schedule(pd.read_csv(args.recommendation), cfg, args.max_batch, pd.read_csv(args.improvement),
                             pd.read_csv(args.predictions))
    write_deploy(schedule, cfg, args.deploy_dir)
    write_csv(schedule, args.out_csv)
    if args.summary is not None and args.plot_dir is not None:
        from workflow_scripts.analysis.plots import save
        from workflow_scripts.analysis.schedule_plot import schedule_chart

        save(schedule_chart(pd.read_csv(args.summary), schedule, cfg), args.plot_dir, "step_schedule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
