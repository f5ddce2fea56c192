"""The slice of the study config the analysis reads, with the defaults of config/schema.yaml.

The Snakemake rules pass it as JSON (``--config-json``) so that each step is a plain ``python -m`` call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workflow_scripts.analysis.stats import Bootstrap
from workflow_scripts.client.cohorts import twin_name
from workflow_scripts.moe.ab import MOE_AB, moe_pairs

DEFAULT_BANDS = {"low": [1, 4], "mid": [16], "high": [32, 64]}
CALIBRATION_KEY = "simulate_acc_len"  # a fixed-acceptance calibration setting (analysis/calibration.py)


def is_calibration(setting: dict[str, Any]) -> bool:
    """A setting that commits a fixed number of tokens per verify: measured for the step's cost, never deployed."""
    return setting.get(CALIBRATION_KEY) is not None


def is_adaptive(setting: dict[str, Any]) -> bool:
    """A setting whose steps change at run time (adaptive speculation, a deployed schedule): it never races, it
    challenges the best static setting of each cell (analysis/decisions.py)."""
    return bool(setting.get("speculative_adaptive"))


@dataclass(frozen=True)
class StudyConfig:
    """Settings, workloads and the ``analysis`` block of the study config."""

    settings: dict[str, dict[str, Any]]
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: str = "baseline"
    pairwise: str | list[list[str]] = "auto"
    bootstrap: Bootstrap = Bootstrap()
    bands: dict[str, list[int]] = field(default_factory=lambda: dict(DEFAULT_BANDS))
    tie_tolerance: float = 0.01
    external: list[dict[str, str]] = field(default_factory=list)
    twin: str | None = None  # the control's A/A twin (benchmark.aa_control), reported apart from the settings
    precision_pct: float = 3.0
    equivalence_pct: float = 4.0  # the margin of the `equivalent` verdict (benchmark.equivalence_pct)
    repeats: int = 3  # the rounds before the race judges anything (benchmark.repeats)
    max_repeats: int = 8  # the most rounds a cell gets: beyond them a metric is out of reach (benchmark.max_repeats)
    predict_max_steps: int = 6  # the cost model predicts steps 1..this (analysis/cost_model/)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> StudyConfig:
        """Build from a full study config (keys ``settings``, ``workloads``, ``analysis``, ``benchmark``)."""
        if "settings" not in config:
            raise ValueError("study config: missing key 'settings'")
        analysis = dict(config.get("analysis") or {})
        settings = {name: dict(args or {}) for name, args in config["settings"].items()}
        bench = dict(config.get("benchmark") or {})
        baseline = analysis.get("baseline", "baseline")
        out = cls(
            settings=settings,
            workloads={name: dict(w or {}) for name, w in (config.get("workloads") or {}).items()},
            baseline=baseline,
            pairwise=analysis.get("pairwise", "auto"),
            bootstrap=Bootstrap(**(analysis.get("bootstrap") or {})),
            bands={str(k): [int(c) for c in v] for k, v in (analysis.get("bands") or DEFAULT_BANDS).items()},
            tie_tolerance=float(analysis.get("tie_tolerance", 0.01)),
            external=list(analysis.get("external") or []),
            twin=twin_name(baseline) if bench.get("aa_control", True) else None,
            precision_pct=float(bench.get("precision_pct", 3.0)),
            equivalence_pct=float(bench.get("equivalence_pct", 4.0)),
            repeats=int(bench.get("repeats", 3)),
            max_repeats=int(bench.get("max_repeats", 8)),
            predict_max_steps=int(analysis.get("predict_max_steps", 6)),
        )
        out._validate()
        return out

    @classmethod
    def from_json(cls, text: str) -> StudyConfig:
        return cls.from_dict(json.loads(text))

    def _validate(self) -> None:
        if not self.equivalence_pct > 0:
            raise ValueError(f"benchmark.equivalence_pct: must be > 0, got {self.equivalence_pct}")
        if self.predict_max_steps < 1:
            raise ValueError(f"analysis.predict_max_steps: must be >= 1, got {self.predict_max_steps}")
        if self.baseline not in self.settings:
            raise ValueError(f"analysis.baseline: {self.baseline!r} is not a setting ({', '.join(self.settings)})")
        if self.pairwise != "auto":
            for pair in self.pairwise:
                if len(pair) != 2 or any(name not in self.settings for name in pair):
                    raise ValueError(f"analysis.pairwise: {pair!r} must be [baseline, candidate] of known settings")
        for i, ext in enumerate(self.external):
            if "path" not in ext or "label" not in ext:
                raise ValueError(f"analysis.external[{i}]: needs keys 'path' and 'label', got {sorted(ext)}")

    def steps(self, setting: str) -> int:
        """Speculative steps of a setting; 0 when it does not speculate (or is unknown, e.g. external)."""
        args = self.settings.get(setting, {})
        if not args.get("speculative_algorithm"):
            return 0
        return int(args.get("speculative_num_steps") or 0)

    def pairs(self) -> list[tuple[str, str]]:
        """Pairwise comparisons: configured, or steps N−1 → N among otherwise identical speculative settings."""
        if self.pairwise != "auto":
            return [(a, b) for a, b in self.pairwise]
        groups: dict[str, list[str]] = {}
        for name, args in self.settings.items():
            if not args.get("speculative_algorithm"):
                continue
            rest = {k: v for k, v in args.items()
                    if k not in ("speculative_num_steps", "speculative_num_draft_tokens")}
            groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(name)
        pairs = []
        for names in groups.values():
            names.sort(key=self.steps)
            pairs += [(a, b) for a, b in zip(names, names[1:]) if self.steps(a) < self.steps(b)]
        return pairs

    def comparisons(self) -> list[tuple[str, str, str]]:
        """(kind, baseline, candidate): every setting against the baseline, the pairwise steps, and each MoE A/B
        pair (default as the baseline, tuned as the candidate)."""
        vs_base = [("vs_baseline", self.baseline, s) for s in self.settings if s != self.baseline]
        moe = [(MOE_AB, default, tuned) for tuned, default, _ in moe_pairs(self.settings)]
        return vs_base + [("pairwise", a, b) for a, b in self.pairs()] + moe

    def workloads_of_kind(self, kind: str) -> list[str]:
        return [name for name, w in self.workloads.items() if w.get("kind") == kind]
