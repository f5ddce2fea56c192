"""Read the MoE shapes of a model from its config.json, the way SGLang's kernels see them.

Why our own reader: SGLang's tuner lost `architectures` and `quantization_config` when it unwrapped
`text_config` (Qwen3.5-122B-A10B nests its MoE fields there). We read the plain JSON, take the MoE
fields from the text config and everything else from the top level, so neither can be dropped, and a
config without MoE fields is refused with its path before any GPU work.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# (key in config.json, meaning); the first one present wins, as in SGLang's per-architecture reads.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_INTERMEDIATE_KEYS = ("moe_intermediate_size", "expert_hidden_dim", "intermediate_size")
_TOPK_KEYS = ("num_experts_per_tok", "top_k_experts", "moe_top_k")

# Bytes per weight element, keyed by SGLang's kernel dtype string (None = the activation dtype).
_WEIGHT_BYTES = {"fp8_w8a8": 1.0, "int8_w8a8": 1.0, "int8_w8a16": 1.0, "int4_w4a16": 0.5}
_FLOAT_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}


class MoeConfigError(ValueError):
    """The model config cannot give MoE shapes; the message names the file and the field."""


@dataclass(frozen=True)
class MoeShape:
    """Per-GPU shapes of one fused-MoE layer, named as in SGLang's config file names."""

    architecture: str
    num_experts: int  # E in the file name: experts on one GPU (global // ep_size)
    shard_n: int  # N in the file name: per-expert intermediate size on one GPU (after TP)
    hidden_size: int
    top_k: int
    act_dtype: str  # float32 | float16 | bfloat16
    kernel_dtype: str | None  # SGLang's dtype selector (fp8_w8a8, ...); None for plain float weights
    block_shape: list[int] | None  # quantization block [n, k], part of the file name when set
    num_layers: int

    @property
    def weight_bytes(self) -> float:
        """Bytes per expert weight element."""
        if self.kernel_dtype is not None:
            return _WEIGHT_BYTES[self.kernel_dtype]
        return _FLOAT_BYTES[self.act_dtype]

    @property
    def act_bytes(self) -> float:
        """Bytes per activation element."""
        return _FLOAT_BYTES[self.act_dtype]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for build records and tables."""
        return asdict(self)


def _config_path(model: Path) -> Path:
    path = model / "config.json" if model.is_dir() else model
    if not path.is_file():
        raise MoeConfigError(f"{path}: no model config.json there")
    return path


def _first(cfg: dict[str, Any], keys: tuple[str, ...], path: Path, what: str) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise MoeConfigError(
        f"{path}: no MoE field for {what} (looked for {', '.join(keys)} at the top level and in text_config); "
        "is this a MoE model?"
    )


def _kernel_dtype(quant: dict[str, Any] | None, path: Path) -> tuple[str | None, list[int] | None]:
    """SGLang's (dtype selector, block_shape) for a quantization_config; (None, None) when unquantized."""
    if not quant:
        return None, None
    method = str(quant.get("quant_method", "")).lower()
    block = quant.get("weight_block_size")
    if block is not None and (not isinstance(block, list) or len(block) != 2):
        raise MoeConfigError(f"{path}: quantization_config.weight_block_size must be [n, k], got {block!r}")
    if method == "fp8":
        return "fp8_w8a8", block
    if method in ("w8a8_int8", "int8"):
        return "int8_w8a8", block
    if method in ("awq", "gptq") and quant.get("bits") == 4:
        group = quant.get("group_size")
        return "int4_w4a16", [0, int(group)] if group else None
    raise MoeConfigError(
        f"{path}: quantization_config.quant_method {quant.get('quant_method')!r} is not one this study "
        "knows the kernel dtype of (fp8, w8a8_int8, awq/gptq 4-bit)"
    )


def _act_dtype(top: dict[str, Any], text: dict[str, Any]) -> str:
    for cfg in (text, top):
        for key in ("dtype", "torch_dtype"):
            value = cfg.get(key)
            if isinstance(value, str) and value in _FLOAT_BYTES:
                return value
    return "bfloat16"  # SGLang's tuner falls back to bf16 when text_config carries no dtype


def read_moe_shape(model: str | Path, tp_size: int = 1, ep_size: int = 1) -> MoeShape:
    """MoE shapes of `model` (a model dir or its config.json) as one GPU of a tp/ep deployment sees them."""
    path = _config_path(Path(model))
    try:
        top = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MoeConfigError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(top, dict):
        raise MoeConfigError(f"{path}: expected a JSON object at the top level")
    nested = top.get("text_config")
    text = {**top, **nested} if isinstance(nested, dict) else top
    if tp_size < 1 or ep_size < 1 or tp_size % ep_size:
        raise MoeConfigError(f"tp_size {tp_size} must be a positive multiple of ep_size {ep_size}")
    experts = _first(text, _EXPERT_KEYS, path, "the expert count")
    intermediate = _first(text, _INTERMEDIATE_KEYS, path, "the per-expert intermediate size")
    top_k = _first(text, _TOPK_KEYS, path, "the experts per token")
    hidden = _first(text, ("hidden_size", "d_model"), path, "the hidden size")
    moe_tp = tp_size // ep_size
    if intermediate % moe_tp or experts % ep_size:
        raise MoeConfigError(
            f"{path}: intermediate size {intermediate} / experts {experts} do not split over tp {tp_size}, ep {ep_size}"
        )
    architectures = top.get("architectures") or text.get("architectures") or ["unknown"]
    quant = top.get("quantization_config") or text.get("quantization_config")
    kernel_dtype, block_shape = _kernel_dtype(quant, path)
    return MoeShape(
        architecture=str(architectures[0]),
        num_experts=experts // ep_size,
        shard_n=intermediate // moe_tp,
        hidden_size=hidden,
        top_k=top_k,
        act_dtype=_act_dtype(top, text),
        kernel_dtype=kernel_dtype,
        block_shape=block_shape,
        num_layers=int(text.get("num_hidden_layers", 0)),
    )
