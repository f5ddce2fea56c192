"""The start-position covariate: fitted from counterbalanced launches, removed before pairing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.paired import paired_ratio

ORDER = ["a", "b", "ctrl", "c", "ctrl_aa"]
EFFECTS = {"ctrl": 0.0, "ctrl_aa": 0.0, "a": 0.10, "b": -0.05, "c": 0.02}
BETA = 0.02  # +2% per position later, as a default study measured


def _study(launches: dict[int, list[str]], rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """improvement_values-shaped rows: four cells, each member's value carrying its effect, its start position's
    and 0.5% of noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for workload in ("synthetic", "realistic"):
        for conc in (4, 16):
            for r in range(rounds):
                order = launches[max(k for k in launches if k <= r)]
                drift = rng.normal(0, 0.05)  # the round's machine phase, shared by every member
                for member, effect in EFFECTS.items():
                    pos = order.index(member) - (len(order) - 1) / 2
                    log_v = math.log(100 * conc) + effect + BETA * pos + drift + rng.normal(0, 0.005, 2)
                    rows.append({"source": "measured", "setting": member, "workload": workload,
                                 "concurrency": conc, "cohort": "k", "repeat": r,
                                 "aggregate_tok_s": math.exp(log_v[0]), "per_request_tok_s": math.exp(log_v[1])})
    return pd.DataFrame(rows)


def test_counterbalanced_launches_identify_the_effect_and_the_adjustment_removes_it():
    launches = {"k": {0: ORDER, 1: ORDER[::-1]}}
    values = _study(launches["k"])
    effects = launch_position.fit(values, launches, "ctrl")
    for effect in effects.values():
        assert effect.identified and effect.comparisons == 4 * 4  # every member but the control, in every cell
        assert effect.ci_low < BETA < effect.ci_high and effect.ci_high - effect.ci_low < 0.01
    raw, adjusted = values, launch_position.adjust(values, launches, effects)
    cell = (values["workload"] == "synthetic") & (values["concurrency"] == 4)

    def ratio(frame: pd.DataFrame, member: str):
        series = frame[cell].pivot_table(index="repeat", columns="setting", values="aggregate_tok_s")
        return paired_ratio(series["ctrl"].to_numpy(), series[member].to_numpy())

    # `a` started 2 positions before the control, then 2 after: raw rounds swing by 8%, and round 2 (the second
    # launch again) tilts the mean; freed of the effect, the rounds agree to the noise and the mean is a's own 10%
    assert ratio(raw, "a").half_width_pct > 5 * ratio(adjusted, "a").half_width_pct
    assert abs(ratio(adjusted, "a").diff_pct - 100 * (math.exp(0.10) - 1)) < 1.0
    assert abs(ratio(raw, "a").diff_pct - 100 * (math.exp(0.10) - 1)) > 1.0
    assert abs(ratio(adjusted, "ctrl_aa").diff_pct) < 1.0  # the twin, 2 positions after the control at first


def test_one_launch_identifies_nothing_and_adjusts_nothing():
    launches = {"k": {0: ORDER}}
    values = _study(launches["k"])
    effects = launch_position.fit(values, launches, "ctrl")
    assert not any(effect.identified for effect in effects.values())
    pd.testing.assert_frame_equal(launch_position.adjust(values, launches, effects), values)
    told = launch_position.sentence(launch_position.as_json(effects))
    assert "not known here" in told


def test_the_launch_that_served_a_round_and_external_rows():
    launches = {"k": {0: ORDER, 1: ORDER[::-1]}}
    values = pd.DataFrame({"setting": ["a", "a", "a", "a"], "cohort": ["k", "k", "k", "external"],
                           "repeat": [0, 1, 5, 0]})
    # a is first of five (centred -2) in launch 0, last (+2) from round 1 on; an external row has no position
    assert launch_position.positions(values, launches).tolist()[:3] == [-2.0, 2.0, 2.0]
    assert math.isnan(launch_position.positions(values, launches).iloc[3])
    metas = [{"cohort": "k", "launch_order": {"0": ORDER, "1": ORDER[::-1]}}, {"cohort": "old"}]
    assert launch_position.launch_orders(metas) == launches
