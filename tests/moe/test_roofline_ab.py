"""Roofline numbers on a known shape (the article's), device resolution, and the A/B table."""

from __future__ import annotations

import pandas as pd
import pytest

from workflow_scripts.moe.ab import ab_table, main as ab_main, moe_pairs
from workflow_scripts.moe.model_shapes import read_moe_shape
from workflow_scripts.moe.roofline import (
    COMPUTE_BOUND, MEMORY_BOUND, experts_touched, main as roofline_main, resolve_device, roofline_row, roofline_table,
)

from .conftest import MODELS

RTX = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"


@pytest.fixture(scope="module")
def qwen35():
    return read_moe_shape(MODELS / "qwen35_fp8", tp_size=4)


def test_article_shape_is_memory_bound_at_every_default_batch_size(qwen35):
    device = resolve_device("sglang", qwen35, RTX, None, None)
    assert (device.peak_tflops, device.mem_bw_gbs, device.source) == (1000, 1792, "datasheet table")
    row = roofline_row(qwen35, device, 1)
    # one token: 8 experts of 3*3072*256 fp8 weights, 6*8*3072*256 FLOPs
    assert row["experts_touched"] == 8.0
    assert row["gflops"] == pytest.approx(6 * 8 * 3072 * 256 / 1e9)
    weight = 8 * 3 * 3072 * 256
    act = 2 * (2 * 3072 + 6 * 8 * 256)
    assert row["intensity_flop_per_byte"] == pytest.approx(6 * 8 * 3072 * 256 / (weight + act))
    assert row["ridge_flop_per_byte"] == pytest.approx(1000e12 / 1792e9)
    table = roofline_table(qwen35, device, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096])
    assert (table.verdict == MEMORY_BOUND).all()
    assert table.intensity_flop_per_byte.is_monotonic_increasing


def test_expected_experts_touched():
    assert experts_touched(256, 8, 1) == pytest.approx(8)
    assert experts_touched(256, 8, 64) == pytest.approx(256 * (1 - (31 / 32) ** 64))
    assert experts_touched(16, 2, 10_000) == pytest.approx(16)


def test_config_override_can_make_it_compute_bound(qwen35):
    device = resolve_device("sglang", qwen35, "made-up GPU", 10.0, 4000.0)
    assert device.source == "config" and device.ridge == pytest.approx(2.5)
    assert roofline_row(qwen35, device, 4096)["verdict"] == COMPUTE_BOUND


def test_unknown_gpu_is_refused(qwen35):
    with pytest.raises(ValueError, match="moe.device.name 'Mystery GPU': not in the roofline table"):
        resolve_device("sglang", qwen35, "Mystery GPU", None, None)
    with pytest.raises(ValueError, match="moe.device.name: needed"):
        resolve_device("sglang", qwen35, None, None, None)


def test_cpu_roofline_is_measured_and_plotted(tmp_path):
    roofline_main(["--model", str(MODELS / "qwen3_moe"), "--engine", "embedded", "--batch-sizes", "1", "64",
                   "--threads", "1", "--out", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.svg")])
    table = pd.read_csv(tmp_path / "r.csv")
    assert list(table.batch_size) == [1, 64]
    assert (table.device_source == "measured on this CPU").all()
    assert table.peak_tflops[0] > 0 and table.mem_bw_gbs[0] > 0
    assert (tmp_path / "r.svg").read_text().startswith("<svg")


def test_pairs_come_from_settings_that_differ_only_in_moe_config():
    settings = {"baseline": {"moe_config": "tuned"}, "baseline_moe_default": {"moe_config": "default"},
                "steps2": {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
                           "speculative_num_draft_tokens": 3, "moe_config": "tuned"},
                "steps2_default": {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2,
                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}}
    assert moe_pairs(settings) == [("baseline", "baseline_moe_default", 1), ("steps2", "steps2_default", 3)]


def _improvement(rows):
    """moe_ab rows of tables/improvement.csv: (source, tuned, default, workload, C, tuned, default tok/s, %, CI, verdict)."""
    out = []
    for source, tuned, default, workload, c, t, d, pct, low, high, verdict in rows:
        out.append({"source": source, "kind": "moe_ab", "baseline": default, "candidate": tuned, "workload": workload,
                    "concurrency": c, "metric": "aggregate_tok_s", "baseline_value": d, "candidate_value": t,
                    "improvement_pct": pct, "ci_low_pct": low, "ci_high_pct": high, "verdict": verdict})
    return pd.DataFrame(out, columns=["source", "kind", "baseline", "candidate", "workload", "concurrency", "metric",
                                      "baseline_value", "candidate_value", "improvement_pct", "ci_low_pct",
                                      "ci_high_pct", "verdict"])


def test_ab_table_ratio_interval_and_agreement(qwen35, tmp_path):
    device = resolve_device("sglang", qwen35, RTX, None, None)
    roofline = roofline_table(qwen35, device, [1, 64])
    improvement = _improvement([
        ("measured", "baseline", "baseline_moe_default", "synthetic", 1, 100.0, 100.0, 0.0, -4.0, 5.0, "within noise"),
        ("measured", "baseline", "baseline_moe_default", "synthetic", 64, 1200.0, 1000.0, 20.0, 17.0, 23.0, "real"),
        ("article", "baseline", "baseline_moe_default", "synthetic", 1, 5.0, 5.0, 0.0, None, None, "within noise"),
    ])
    table = ab_table(improvement, roofline, [("baseline", "baseline_moe_default", 1)])
    assert list(table.concurrency) == [1, 64]
    first, second = table.iloc[0], table.iloc[1]
    assert first.ratio == pytest.approx(1.0)
    assert (first.ratio_ci_low, first.ratio_ci_high) == pytest.approx((0.96, 1.05))
    assert first.measured == "no measurable difference" and first.predicted == MEMORY_BOUND and first.agrees
    assert second.measured == "tuned faster" and not second.agrees  # memory-bound predicted, a win measured
    fast_memory = resolve_device("sglang", qwen35, "made-up GPU", 1.0, 4000.0)  # ridge 0.25: all compute-bound
    compute = ab_table(improvement, roofline_table(qwen35, fast_memory, [1]), [("baseline", "baseline_moe_default", 1)])
    assert (compute.predicted == COMPUTE_BOUND).all() and compute.agrees.all()  # "can help": equal or faster
    improvement.to_csv(tmp_path / "improvement.csv", index=False)
    roofline.to_csv(tmp_path / "roofline.csv", index=False)
    ab_main(["--improvement", str(tmp_path / "improvement.csv"), "--roofline", str(tmp_path / "roofline.csv"),
             "--pair", "baseline:baseline_moe_default:1", "--out", str(tmp_path / "ab.csv"), "--plot", str(tmp_path / "ab.svg")])
    assert len(pd.read_csv(tmp_path / "ab.csv")) == 2 and (tmp_path / "ab.svg").stat().st_size > 0


def test_ab_refuses_an_improvement_table_without_the_columns(qwen35):
    roofline = roofline_table(qwen35, resolve_device("sglang", qwen35, RTX, None, None), [1])
    with pytest.raises(ValueError, match=r"improvement.csv: missing column\(s\) \['verdict'\]"):
        ab_table(_improvement([]).drop(columns=["verdict"]), roofline, [("a", "b", 1)])
    with pytest.raises(ValueError, match="no measured moe_ab rows for any pair"):
        ab_table(_improvement([("measured", "a", "c", "w", 1, 1.0, 1.0, 0.0, -1.0, 1.0, "within noise")]),
                 roofline, [("a", "b", 1)])
