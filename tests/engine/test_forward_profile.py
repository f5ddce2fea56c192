"""The forward profile reads the real engine's own decode-forward counters over the stretch where every row of a
cell decodes (tiny pair, in-process), and writes the table the cost model reads."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workflow_scripts.profiling import FORWARD_PROFILE_COLUMNS
from workflow_scripts.profiling.forward_profile import (
    engines,
    full_batch_steps,
    main,
    median_interval,
    profile,
    seconds_per_step,
)

NEW_TOKENS = 9


@pytest.fixture(scope="module")
def pair_engines(target_dir, dense_draft_dir):
    running = engines(target_dir, dense_draft_dir, 3, 4, 1, "auto")
    yield running
    for engine in running.values():
        engine.stop()


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_the_window_counts_the_forwards_where_every_row_decodes(pair_engines, steps):
    prompts = [[5 + i, 9, 13, 17 + i] for i in range(3)]
    seconds, forwards = full_batch_steps(pair_engines[steps], prompts, NEW_TOKENS)
    assert seconds > 0
    # A prefill gives a row its first token; each decode forward 1..k+1 more. The window opens when the last row
    # has its first token and closes when the first row finishes, so the drain after it is never counted. Rows
    # submitted one after another may start a forward apart (the engine thread picks up the first alone), and each
    # forward a row ran before the window opened is one fewer in it.
    late = len(prompts) - 1
    fewest = math.ceil((NEW_TOKENS - 1) / (steps + 1))
    assert max(1, fewest - late) <= forwards <= NEW_TOKENS - 1
    if steps == 0:
        assert forwards >= NEW_TOKENS - 1 - late


def test_a_measurement_repeats_the_cell_until_it_holds_min_seconds(pair_engines):
    engine, prompts = pair_engines[0], [[5, 9, 13, 17]]
    one, _ = full_batch_steps(engine, prompts, NEW_TOKENS)
    before = engine.stats()["total_decode_forwards"]
    seconds_per_step(engine, prompts, NEW_TOKENS, min_seconds=5 * one)
    cells = (engine.stats()["total_decode_forwards"] - before) / (NEW_TOKENS - 1)  # the plain engine: N-1 a cell
    assert cells >= 3  # ~5 cells' worth of windows (their length varies with the host)


def test_the_cli_writes_one_row_per_concurrency_and_steps(target_dir, dense_draft_dir, tmp_path):
    out = tmp_path / "profile" / "forward_profile.csv"
    main(["--target", str(target_dir), "--draft", str(dense_draft_dir), "--concurrency", "4", "1",
          "--max-steps", "2", "--repeats", "1", "--new-tokens", "8", "--min-seconds", "0", "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table.columns) == list(FORWARD_PROFILE_COLUMNS)
    assert sorted(zip(table.concurrency, table.steps)) == [(c, k) for c in (1, 4) for k in range(3)]
    assert (table["seconds"] > 0).all()
    for c, g in table.groupby("concurrency"):  # one repeat: a step's seconds ÷ the plain step's of its block
        base = float(g.loc[g["steps"] == 0, "seconds"].iloc[0])
        assert g["step_cost"].to_numpy() == pytest.approx(g["seconds"].to_numpy() / base)
        assert float(g.loc[g["steps"] == 0, "step_cost"].iloc[0]) == 1.0
    # one repeat: its range is the one ratio
    assert table["step_cost_low"].to_numpy() == pytest.approx(table["step_cost"].to_numpy())
    assert table["step_cost_high"].to_numpy() == pytest.approx(table["step_cost"].to_numpy())


def test_the_range_over_repeats_holds_the_median(target_dir, dense_draft_dir):
    table = profile(target_dir, dense_draft_dir, [2], 2, repeats=3, new_tokens=8, threads=1, min_seconds=0)
    assert (table["step_cost_low"] <= table["step_cost"]).all() and (table["step_cost"] <= table["step_cost_high"]).all()
    plain = table[table["steps"] == 0]
    assert (plain[["step_cost", "step_cost_low", "step_cost_high"]].to_numpy() == 1.0).all()
    drafted = table[table["steps"] > 0]  # three blocks on a shared host never give the same ratio thrice
    assert (drafted["step_cost_high"] > drafted["step_cost_low"]).all()


@pytest.mark.parametrize(("n", "j"), [(1, 1), (2, 1), (5, 1), (8, 1), (9, 2), (15, 4), (25, 8)])
def test_the_median_interval_is_the_widest_order_statistic_pair_that_keeps_its_coverage(n, j):
    """j-th lowest and j-th highest of n, j the largest with 1 − 2·P(Bin(n, ½) < j) ≥ 1 − 2^−4 (5 repeats' range)."""
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    assert median_interval(values) == (float(j), float(n - j + 1))
    coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
    assert coverage >= 1 - 2**-4 or j == 1
    assert 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2**n < 1 - 2**-4


def test_a_bad_flag_fails_naming_it(target_dir, dense_draft_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--target", str(target_dir), "--draft", str(dense_draft_dir), "--concurrency", "0",
              "--out", str(tmp_path / "p.csv")])
    assert "--concurrency must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()
