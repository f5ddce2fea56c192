"""Metric definitions and statistics on hand-made per-request records with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.analysis.request_data import cell, frame
from workflow_scripts.analysis.metrics import add_request_metrics, cell_table, inter_chunk_gaps
from workflow_scripts.analysis.stats import MAD_TO_SIGMA, Bootstrap, robust_score, within_noise
from workflow_scripts.analysis.summarize import summarize_measured


def _metrics(rows):
    return add_request_metrics(frame(rows))


def test_per_request_tpot_itl_and_acceptance_follow_their_definitions():
    df = _metrics(cell("s", "w", 1, 0, n=3, warmup=0, tok_s=100.0, tokens=16, tokens_per_chunk=4))
    assert df["per_request_tok_s"].tolist() == pytest.approx([100.0] * 3)
    # TPOT: decode time 0.16 s over the 15 tokens after the first
    assert df["tpot_s"].tolist() == pytest.approx([0.16 / 15] * 3)
    # 4 chunks of 4 tokens spread over 0.16 s: three gaps of 0.16/3 s each per request
    assert inter_chunk_gaps(df["chunk_ts"]).tolist() == pytest.approx([0.16 / 3] * 9)
    summary = summarize_measured(df, cell_table(df), Bootstrap(resamples=100))
    assert summary.loc[0, "accept_length_mean"] == pytest.approx(4.0)
    assert summary.loc[0, "accept_length_token_weighted"] == pytest.approx(4.0)
    assert summary.loc[0, "ttft_p50_ms"] == pytest.approx(50.0)
    assert summary.loc[0, "tpot_p50_ms"] == pytest.approx(160 / 15)


def test_aggregate_without_stragglers_counts_every_measured_token_from_first_send_to_last_end():
    # 4 requests on 2 lanes, each 0.05 s TTFT + 0.16 s decode, back to back: the window is the whole 0.42 s
    cells = cell_table(_metrics(cell("s", "w", 2, 0, n=4, warmup=0, tok_s=100.0, tokens=16)))
    assert cells.loc[0, "aggregate_tok_s"] == pytest.approx(64 / 0.42)
    # a warm-up request first: the window opens at the first measured send and closes when a lane is left empty
    # (the 4th of 5 ends: 0.42 s); the warm-up's 16 tokens fall inside it (0.05-0.21 s) and count
    cells = cell_table(_metrics(cell("s", "w", 2, 0, n=4, warmup=1, tok_s=100.0, tokens=16)))
    assert cells.loc[0, "n_ok"] == 4
    assert cells.loc[0, "aggregate_tok_s"] == pytest.approx(64 / 0.42)


def test_aggregate_leaves_out_the_drain_of_a_straggler():
    # 2 lanes; the warm-up wave ends together at 0.21 s, then one measured request takes 0.21 s and the other 0.69 s
    # (16 tokens at 25 tok/s). Only 0.21-0.42 s has both lanes busy: 16 + 4 of the straggler's tokens (its chunks
    # come every 0.64/15 s from 0.26 s). First send to last end would be 32 tokens over 0.69 s, half the rate,
    # because the straggler decoded alone for its last 0.48 s.
    rows = cell("s", "w", 2, 0, n=2, warmup=2, tok_s=[100, 100, 100, 25], tokens=16)
    assert cell_table(_metrics(rows)).loc[0, "aggregate_tok_s"] == pytest.approx(20 / 0.21)


def test_aggregate_counts_warmup_tokens_streamed_while_measured_requests_run():
    # a warm-up straggler (0.05-0.69 s) keeps one lane while two measured requests run back to back on the other
    # (0.21-0.63 s). The window, 0.21 s (first measured send) to 0.63 s (the 3rd of 4 ends, the first with no
    # request left to replace it), holds both measured requests' 32 tokens and 10 of the warm-up's: 100 tok/s,
    # where the measured tokens alone would give 76 and miss the lane the warm-up held
    rows = cell("s", "w", 2, 0, n=2, warmup=2, tok_s=[100, 25, 100, 100], tokens=16)
    assert cell_table(_metrics(rows)).loc[0, "aggregate_tok_s"] == pytest.approx(42 / 0.42)


def test_all_errored_cell_is_empty_not_zero():
    rows = cell("s", "w", 4, 0, n=5, error="connection reset") + cell("s", "w", 4, 1, n=5, error="timeout")
    df = _metrics(rows)
    cells = cell_table(df)
    assert cells["n_ok"].tolist() == [0, 0] and cells["n_err"].tolist() == [5, 5]
    assert cells["aggregate_tok_s"].isna().all() and cells["per_request_tok_s_median"].isna().all()
    summary = summarize_measured(df, cells, Bootstrap(resamples=100))
    row = summary.iloc[0]
    assert (row["n_ok"], row["n_err"]) == (0, 10)
    for col in ("per_request_tok_s_median", "aggregate_tok_s_median", "ttft_p50_ms", "tpot_p50_ms",
                "accept_length_mean"):
        assert math.isnan(row[col]), col


def test_zero_decode_time_gives_nan_not_infinity():
    rows = cell("s", "w", 1, 0, n=1, warmup=0, tokens=1)
    rows[0]["end_ts"] = rows[0]["first_token_ts"]
    df = _metrics(rows)
    assert math.isnan(df.loc[0, "per_request_tok_s"]) and math.isnan(df.loc[0, "tpot_s"])


def test_bootstrap_median_ci_is_seeded_and_brackets_the_median():
    boot = Bootstrap(resamples=500, ci=0.95, seed=3)
    values = np.array([90.0, 100.0, 110.0, 95.0, 105.0])
    first, second = boot.median_ci(values), boot.median_ci(values)
    assert first == second
    median, low, high = first
    assert median == 100.0 and 90.0 <= low < median < high <= 110.0
    assert boot.median_ci(np.array([7.0, 7.0, 7.0])) == (7.0, 7.0, 7.0)
    single = boot.median_ci(np.array([42.0]))
    assert single[0] == 42.0 and math.isnan(single[1]) and math.isnan(single[2])
    assert all(math.isnan(x) for x in boot.median_ci(np.array([np.nan, np.nan])))


def test_ratio_ci_and_within_noise():
    boot = Bootstrap(resamples=500)
    point, low, high = boot.ratio_ci(np.array([100.0, 100.0, 100.0]), np.array([150.0, 150.0, 150.0]))
    assert (point, low, high) == pytest.approx((0.5, 0.5, 0.5))
    assert within_noise(low, high) is False
    point, low, high = boot.ratio_ci(np.array([100.0, 110.0, 90.0]), np.array([105.0, 95.0, 100.0]))
    assert point == pytest.approx(0.0) and low < 0 < high
    assert within_noise(low, high) is True
    point, low, high = boot.ratio_ci(np.array([100.0]), np.array([120.0]))
    assert point == pytest.approx(0.2) and within_noise(low, high) is None
    assert all(math.isnan(x) for x in boot.ratio_ci(np.array([np.nan]), np.array([120.0])))


def test_robust_score_is_median_minus_scaled_mad():
    score, median, mad = robust_score(np.array([8.0, 12.0, 10.0, 9.0, 11.0]))
    assert (median, mad) == (10.0, 1.0)
    assert score == pytest.approx(10.0 - MAD_TO_SIGMA)
    assert robust_score(np.array([5.0, 5.0, 5.0]))[0] == 5.0
    assert math.isnan(robust_score(np.array([]))[0])


def test_bootstrap_rejects_bad_parameters_by_key():
    with pytest.raises(ValueError, match="analysis.bootstrap.ci"):
        Bootstrap(ci=1.5)
    with pytest.raises(ValueError, match="analysis.bootstrap.resamples"):
        Bootstrap(resamples=0)
