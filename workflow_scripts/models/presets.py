"""Build presets of the model pair, and `key=value` overrides of them.

Why these default shapes: decoding on CPU is memory-bound per token, so the target is a Qwen3-MoE with
16 experts and top-4 (the fewest experts the study allows, with the largest sensible top-k): at batch 1 a
token reads a quarter of the expert weights, at batch 16 nearly all, so batching and speculative
verification both behave as they do for production MoEs, while the whole target stays ~26 M parameters
(~7 M active) and decodes in milliseconds. Hidden 256 / 4 layers is the dense model that trains to a
useful loss within the 8-minute budget (docs/measurements/build_budget.md); the experts are upcycled copies of its MLP
(moe_intermediate_size = the dense intermediate size). The draft is one dense layer of the same width,
so it starts from the target's embeddings, first layer and LM head, and is distilled on the target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BuildSettings:
    """Every knob of a build; recorded whole in build_info.json."""

    # corpus and tokenizer
    max_files: int | None  # None = the whole stdlib; a number = a fixed subset (smoke)
    vocab_size: int
    # shared transformer shape
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP of the pre-upcycle model, and each expert's size
    max_position_embeddings: int
    # target
    target_layers: int
    num_experts: int
    num_experts_per_tok: int
    # draft
    draft_layers: int
    draft_intermediate_size: int
    # training (fixed step counts, never time budgets: the weights must not depend on machine speed)
    seq_len: int
    batch_size: int
    dense_steps: int
    dense_lr: float
    moe_steps: int
    moe_lr: float
    expert_noise: float  # relative std of the per-expert perturbation at upcycling
    router_init_std: float
    router_aux_loss_coef: float
    distill_tokens: int  # tokens the target labels once for the draft's distillation
    distill_top_k: int  # teacher probabilities kept per position
    draft_steps: int
    draft_lr: float
    warmup_steps: int
    weight_decay: float
    # "bfloat16" (autocast: ~2x faster than float32 on CPUs with AVX512-BF16 or AMX, but ~17x slower on an AVX2-only
    # CPU, where it is emulated), "float32", or "auto": bfloat16 where the CPU has native bf16, else float32
    train_dtype: str
    # fixed, so that a seed gives the same bytes on every machine: the thread count changes float reduction order.
    # The default pair trains on 2: faster than on 1 on a quiet 2-core machine, slower beside a process that keeps
    # one of its cores busy (docs/measurements/build_budget.md)
    num_threads: int
    eval_tokens: int  # held-out tokens used for val loss, agreement and routing statistics
    greedy_eval_prompts: int  # held-out heads the target continues greedily (acceptance estimate)
    greedy_eval_tokens: int  # at most this many new tokens each


PRESETS: dict[str, BuildSettings] = {
    "default": BuildSettings(
        max_files=None, vocab_size=1024,
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
        max_position_embeddings=2048,
        target_layers=4, num_experts=16, num_experts_per_tok=4,
        draft_layers=1, draft_intermediate_size=512,
        seq_len=256, batch_size=16, dense_steps=320, dense_lr=2e-3,
        moe_steps=6, moe_lr=5e-4, expert_noise=0.02, router_init_std=0.05, router_aux_loss_coef=0.01,
        distill_tokens=393216, distill_top_k=16, draft_steps=900, draft_lr=2e-3, warmup_steps=30, weight_decay=0.1,
        train_dtype="auto", num_threads=2, eval_tokens=24576,
        greedy_eval_prompts=12, greedy_eval_tokens=64,
    ),
    "smoke": BuildSettings(
        max_files=60, vocab_size=512,
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=128,
        max_position_embeddings=2048,
        target_layers=2, num_experts=16, num_experts_per_tok=4,
        draft_layers=1, draft_intermediate_size=128,
        seq_len=128, batch_size=8, dense_steps=60, dense_lr=3e-3,
        moe_steps=5, moe_lr=1e-3, expert_noise=0.02, router_init_std=0.05, router_aux_loss_coef=0.01,
        distill_tokens=8192, distill_top_k=16, draft_steps=30, draft_lr=3e-3, warmup_steps=5, weight_decay=0.1,
        train_dtype="auto", num_threads=1, eval_tokens=4096,
        greedy_eval_prompts=4, greedy_eval_tokens=16,
    ),
}

_TRAIN_DTYPES = ("auto", "bfloat16", "float32")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it, more than 10x
    slower than float32 (docs/measurements/build_budget.md)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def _parse_value(key: str, raw: str, current: object) -> object:
    """Parse `raw` to the type of the field's current value (None allowed for max_files)."""
    if raw.lower() == "none":
        if key != "max_files":
            raise ValueError(f"--set {key}=None: only max_files may be None")
        return None
    kind = float if isinstance(current, float) else str if isinstance(current, str) else int
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"--set {key}={raw!r}: expected {kind.__name__}") from None


def resolve(preset: str, overrides: dict[str, str] | None = None) -> BuildSettings:
    """The preset's settings with `overrides` (raw strings, as from `--set key=value`) applied and checked."""
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is unknown; choose one of {sorted(PRESETS)}")
    base = PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(base)}
    changes = {}
    for key, raw in (overrides or {}).items():
        if key not in fields:
            raise ValueError(f"--set {key}: unknown setting; known: {', '.join(sorted(fields))}")
        changes[key] = _parse_value(key, raw, getattr(base, key))
    settings = dataclasses.replace(base, **changes)
    check(settings)
    if settings.train_dtype == "auto":  # resolved here, so build_info records the dtype the pair was trained in
        settings = dataclasses.replace(settings, train_dtype="bfloat16" if native_bf16() else "float32")
    return settings


def check(s: BuildSettings) -> None:
    """Refuse settings that would build a pair outside the study's contract."""
    problems = []
    if s.num_experts < 16 or s.num_experts_per_tok < 2 or s.num_experts_per_tok > s.num_experts:
        problems.append(f"num_experts={s.num_experts}, num_experts_per_tok={s.num_experts_per_tok} "
                        "(need >= 16 experts and 2 <= top-k <= experts)")
    if not 1 <= s.draft_layers <= 2 or s.hidden_size > 256:
        problems.append(f"draft_layers={s.draft_layers}, hidden_size={s.hidden_size} (draft: 1-2 layers, hidden <= 256)")
    if s.num_attention_heads % s.num_key_value_heads:
        problems.append(f"num_attention_heads={s.num_attention_heads} not a multiple of "
                        f"num_key_value_heads={s.num_key_value_heads}")
    if s.train_dtype not in _TRAIN_DTYPES:
        problems.append(f"train_dtype={s.train_dtype!r} (choose {_TRAIN_DTYPES})")
    positive = ["vocab_size", "hidden_size", "head_dim", "intermediate_size", "target_layers", "seq_len",
                "batch_size", "dense_steps", "draft_steps", "num_threads", "eval_tokens", "distill_top_k",
                "greedy_eval_prompts", "greedy_eval_tokens"]
    problems += [f"{k}={getattr(s, k)} (must be > 0)" for k in positive if getattr(s, k) <= 0]
    problems += [f"{k}={getattr(s, k)} (must be >= 0)" for k in ("moe_steps", "warmup_steps", "expert_noise")
                 if getattr(s, k) < 0]
    if s.distill_tokens < s.batch_size * s.seq_len:
        problems.append(f"distill_tokens={s.distill_tokens} < one batch (batch_size * seq_len)")
    if s.distill_top_k > s.vocab_size:
        problems.append(f"distill_top_k={s.distill_top_k} > vocab_size={s.vocab_size}")
    if s.seq_len > s.max_position_embeddings:
        problems.append(f"seq_len={s.seq_len} > max_position_embeddings={s.max_position_embeddings}")
    if problems:
        raise ValueError("bad build settings: " + "; ".join(problems))
