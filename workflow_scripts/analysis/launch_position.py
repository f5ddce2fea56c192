"""A server's start position as a covariate of the paired comparisons: fitted on the study's own rounds, removed
from every measured value before pairing.

A cohort starts its servers one after another, and where a server sits in that order changes its speed: in two
default studies on a 2-core Xeon, each position later ran 0.9% and 2.1% faster, 6-13% between the first and the
last of seven, and in another study not at all (docs/measurements/launch_order.md). Pairing within rounds cannot
see an offset that is the same in every round of a launch. With counterbalanced launches (`benchmark.counterbalance_launches`: a second launch in the
reverse order) every member is measured at two positions, which identifies the effect: per metric, the log ratio
of a member to the control in a round is its own effect (per cohort, cell and member) plus beta times its position
relative to the control's, and beta is the within-member least-squares slope over every such comparison of the
study (the twin's included). Each measured value is then divided by exp(beta * its centred position), so a pair
compares settings as if both had started mid-way. Without a second launch beta is not identified and nothing is
adjusted; the summary says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

METRICS = ("aggregate_tok_s", "per_request_tok_s")
CELL = ["cohort", "workload", "concurrency"]
Launches = dict[str, dict[int, list[str]]]  # cohort -> round a launch started at -> members in start order


@dataclass(frozen=True)
class PositionEffect:
    """The effect of starting one position later (fraction, on the log scale) and its 95% CI."""

    beta: float
    ci_low: float
    ci_high: float
    comparisons: int  # member-cells whose position changed between launches (those that identify beta)

    @property
    def identified(self) -> bool:
        return self.comparisons > 0 and math.isfinite(self.beta)


NOT_IDENTIFIED = PositionEffect(math.nan, math.nan, math.nan, 0)


def launch_orders(metas: list[dict]) -> Launches:
    """Each cohort's launches from its meta (`launch_order`: round -> members in start order)."""
    return {m["cohort"]: {int(r): order for r, order in m.get("launch_order", {}).items()} for m in metas
            if m.get("launch_order")}


def launch_of(round_: int, by_round: dict[int, list[str]]) -> int | None:
    """The launch that served a round: the latest one started at or before it (None: none had started)."""
    served = [r for r in by_round if r <= round_]
    return max(served) if served else None


def positions(values: pd.DataFrame, launches: Launches) -> pd.Series:
    """Each measured row's start position in the launch that served its round, centred on the middle of the
    order (NaN: external rows, or a cohort without a launch record)."""
    out = pd.Series(np.nan, index=values.index)
    for cohort, by_round in launches.items():
        rows = values["cohort"] == cohort
        for idx, setting, round_ in zip(values.index[rows], values.loc[rows, "setting"], values.loc[rows, "repeat"]):
            launch = launch_of(round_, by_round)
            order = [] if launch is None else by_round[launch]
            if setting in order:
                out[idx] = order.index(setting) - (len(order) - 1) / 2
    return out


def fit(values: pd.DataFrame, launches: Launches, control: str) -> dict[str, PositionEffect]:
    """Per metric, beta from the log ratios to the control (module doc); NOT_IDENTIFIED without a second launch."""
    frame = values.assign(position=positions(values, launches)).dropna(subset=["position"])
    keys = [*CELL, "repeat"]
    ctrl = frame[frame["setting"] == control].set_index(keys)[[*METRICS, "position"]].add_suffix("_control")
    others = frame[frame["setting"] != control].merge(ctrl, left_on=keys, right_index=True, how="left")
    out = {}
    for metric in METRICS:
        rows = others.dropna(subset=[metric, f"{metric}_control"])
        rows = rows[(rows[metric] > 0) & (rows[f"{metric}_control"] > 0)]
        y = np.log(rows[metric] / rows[f"{metric}_control"])
        x = rows["position"] - rows["position_control"]
        groups = [rows[k] for k in (*CELL, "setting")]
        xt = x - x.groupby(groups).transform("mean")
        yt = y - y.groupby(groups).transform("mean")
        sxx = float((xt**2).sum())
        moved = (xt.abs() > 1e-9).groupby(groups).any()  # per setting × cell: measured at two positions
        df = len(rows) - len(moved) - 1
        if sxx <= 0 or df < 1:
            out[metric] = NOT_IDENTIFIED
            continue
        beta = float((xt * yt).sum() / sxx)
        se = math.sqrt(float(((yt - beta * xt) ** 2).sum()) / df / sxx)
        half = float(stats.t.ppf(0.975, df)) * se
        out[metric] = PositionEffect(beta, beta - half, beta + half, int(moved.sum()))
    return out


def adjust(values: pd.DataFrame, launches: Launches, effects: dict[str, PositionEffect]) -> pd.DataFrame:
    """The values as if every server had started mid-way: each metric divided by exp(beta * centred position)."""
    pos = positions(values, launches)
    out = values.copy()
    for metric, effect in effects.items():
        if effect.identified:
            out[metric] = out[metric] * np.exp(-effect.beta * pos.fillna(0.0))
    return out


def as_json(effects: dict[str, PositionEffect]) -> dict[str, dict]:
    """For noise_floor.json: per metric, beta and its CI in percent per position, and the comparisons used."""
    def pct(value: float) -> float | None:
        return round(100 * value, 3) if math.isfinite(value) else None

    return {metric: {"beta_pct": pct(e.beta), "ci_low_pct": pct(e.ci_low), "ci_high_pct": pct(e.ci_high),
                     "comparisons": e.comparisons} for metric, e in effects.items()}


def sentence(effects: dict[str, dict] | None) -> str:
    """The summary's line on the start-position effect, from noise_floor.json's `launch_position`."""
    fitted = {m: e for m, e in (effects or {}).items() if e["beta_pct"] is not None}
    if not fitted:
        return ("Each server started once, at one position of its cohort's start order, so the effect of that "
                "position is not known here and sits in every comparison alike (it was ~2% per position on a 2-core "
                "Xeon: docs/measurements/launch_order.md); the noise floor bounds it.")
    labels = {"aggregate_tok_s": "aggregate", "per_request_tok_s": "per-request"}
    told = "; ".join(f"{labels.get(m, m)} {e['beta_pct']:+.1f}% [{e['ci_low_pct']:+.1f}, {e['ci_high_pct']:+.1f}] "
                     f"over {e['comparisons']} settings × cells" for m, e in fitted.items())
    return (f"Each position later in the servers' start order changed a server's throughput by: {told} (fitted on "
            "the settings measured at two positions of counterbalanced launches). Every comparison here pairs values "
            "freed of that linear effect (docs/method.md); the noise floor bounds what it leaves.")
