"""Tune the embedded engine's fused-MoE kernel on this CPU, for real.

Every config of `fused_moe.search_space()` is timed at each batch size with the target's real shapes
(and its layer-0 expert weights when the checkpoint has them in a layout we know; random weights of
the same shapes otherwise). The result is SGLang-shaped: {batch size: best config}.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from workflow_scripts.engine import fused_moe as engine_moe
from workflow_scripts.moe.model_shapes import MoeShape
from workflow_scripts.moe.search import Key, Measure, run_search

# One timing sample lasts at least this long (several kernel calls when one is shorter), so that timer
# resolution and scheduler jitter on a shared machine stay small against it.
MIN_SAMPLE_S = 0.01
# "wall": elapsed time, what a server sees (right on a machine of one's own). "cpu": this process's CPU
# time, blind to other tenants preempting us (right on a shared machine, with one torch thread).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_EXPERT_KEY = re.compile(r"layers\.0\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass
class LayerWeights:
    """One MoE layer's weights in the engine's layout, and where they came from."""

    experts: engine_moe.Experts
    gate: torch.Tensor | None  # router [E, H], when the checkpoint has it
    source: str


def _random_weights(shape: MoeShape, dtype: torch.dtype, seed: int, why: str) -> LayerWeights:
    gen = torch.Generator().manual_seed(seed)
    E, N, H = shape.num_experts, shape.shard_n, shape.hidden_size
    gate, up = (list(torch.randn(E, N, H, generator=gen).mul_(H**-0.5).to(dtype)) for _ in range(2))
    down = list(torch.randn(E, H, N, generator=gen).mul_(N**-0.5).to(dtype))
    return LayerWeights(engine_moe.pack_experts(gate, up, down), None, f"random ({why})")


def load_layer_weights(model_dir: Path, shape: MoeShape, seed: int) -> LayerWeights:
    """Layer 0's experts from model.safetensors (per-expert HF keys), else seeded random ones of the same shapes."""
    from safetensors import safe_open

    dtype = _TORCH_DTYPES[shape.act_dtype]
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return _random_weights(shape, dtype, seed, f"no *.safetensors in {model_dir}")
    parts: dict[tuple[int, str], torch.Tensor] = {}
    gate = None
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                match = _EXPERT_KEY.search(key)
                if match:
                    parts[(int(match[1]), match[2])] = f.get_tensor(key)
                elif key.endswith("layers.0.mlp.gate.weight"):
                    gate = f.get_tensor(key)
    E = shape.num_experts
    if len(parts) != 3 * E:
        return _random_weights(shape, dtype, seed, f"{model_dir}: no per-expert layer-0 weights in a known layout")
    gate_up_down = [[parts[(e, proj)].to(dtype) for e in range(E)] for proj in ("gate_proj", "up_proj", "down_proj")]
    expected = [(shape.shard_n, shape.hidden_size)] * 2 + [(shape.hidden_size, shape.shard_n)]
    found = [tuple(ws[0].shape) for ws in gate_up_down]
    if found != expected:
        raise ValueError(f"{model_dir}: layer-0 expert gate/up/down weights {found} do not match config.json ({expected})")
    return LayerWeights(engine_moe.pack_experts(*gate_up_down), None if gate is None else gate.to(dtype), f"{model_dir} layer 0")


def _inputs(weights: LayerWeights, shape: MoeShape, M: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and router logits for M tokens (real router when present: realistic expert spread)."""
    gen = torch.Generator().manual_seed(seed + M)
    hidden = torch.randn(M, shape.hidden_size, generator=gen).to(weights.experts.w13.dtype)
    if weights.gate is not None:
        logits = hidden @ weights.gate.T
    else:
        logits = torch.randn(M, shape.num_experts, generator=gen)
    return hidden, logits.float()


def _calls_per_sample(run, clock, floor_s: float = MIN_SAMPLE_S) -> int:
    """How many kernel calls one timing sample needs to last `floor_s` (one warm-up call, then one timed)."""
    run()
    start = clock()
    run()
    return max(1, int(floor_s / max(clock() - start, 1e-6) + 0.999))


def make_measure(
    weights: LayerWeights, shape: MoeShape, M: int, space: list[dict], seed: int, clock: str = "wall"
) -> Measure:
    """measure(i) -> seconds per fused_moe call with config space[i], at M tokens.

    Each config is warmed up and calibrated on its first sample (slow configs get fewer calls per
    sample); that calibration is not a counted evaluation (it shows in the wall time).
    """
    hidden, logits = _inputs(weights, shape, M, seed)
    timer = CLOCKS[clock]
    calls: dict[int, int] = {}

    def measure(i: int) -> float:
        def run():
            return engine_moe.fused_moe(hidden, logits, weights.experts, shape.top_k, True, space[i])

        with torch.inference_mode():
            if i not in calls:
                calls[i] = _calls_per_sample(run, timer)
            start = timer()
            for _ in range(calls[i]):
                run()
            return (timer() - start) / calls[i]

    return measure


def computation_key(config: dict, M: int) -> tuple[str, int]:
    """What fused_moe computes for M tokens under `config`: its strategy and token chunk size.

    Every block_m >= M runs all M tokens as one chunk, so those configs do identical work and halving
    measures just one of them: the last in `space`, in search_space()'s order the largest block_m (one
    chunk at the nearby M that the engine also serves with this batch size's entry).
    """
    return config["strategy"], min(config["block_m"], M)


def same_work(space: list[dict], M: int) -> Key:
    """The search's equivalence key over `space` at M tokens (`computation_key`)."""
    return lambda i: computation_key(space[i], M)


def tune_batch_size(
    weights: LayerWeights, shape: MoeShape, M: int, space: list[dict], search: str, repeats: int, seed: int,
    clock: str = "wall",
) -> dict:
    """Search `space` at M tokens; returns the winner, its time, and what the search cost."""
    started = time.perf_counter()
    measure = make_measure(weights, shape, M, space, seed, clock)
    result = run_search(search, len(space), measure, repeats, key=same_work(space, M))
    return {
        "config": space[result.best],
        "time_s": result.best_s,
        "evaluations": result.evaluations,
        "space_size": len(space),
        "wall_s": time.perf_counter() - started,
        "scores_s": {str(i): t for i, t in result.scores().items()},
    }


def tune(
    weights: LayerWeights, shape: MoeShape, batch_sizes: list[int], search: str, repeats: int, seed: int,
    clock: str = "wall",
) -> dict[int, dict]:
    """tune_batch_size for each batch size, with progress."""
    space = engine_moe.search_space()
    return {
        M: tune_batch_size(weights, shape, M, space, search, repeats, seed, clock)
        for M in tqdm(batch_sizes, desc=f"tuning fused_moe ({search})", unit="batch size")
    }
