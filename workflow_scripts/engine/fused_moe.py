"""The embedded engine's fused-MoE layer and its per-batch-size kernel configs.

Mirrors SGLang's fused_moe_triton layout so that the MoE-tuning stage treats both engines alike:
configs live in `$SGLANG_MOE_CONFIG_DIR/configs/<ENGINE_VERSION_DIR>/E=..,N=..,device_name=...json`
as JSON `{batch_size: config}`, the entry nearest to the token count M is used, and the file used
(or missing) is logged in SGLang's words. A "kernel config" here is a CPU execution strategy plus
a token block size; they change speed only, never the result (beyond float rounding).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workflow_scripts.engine.linear import Linear

logger = logging.getLogger(__name__)

ENGINE_VERSION_DIR = "embedded_v1"
STRATEGIES = ("loop", "sorted", "gather_bmm")
BLOCK_MS = (8, 16, 32, 64, 128, 256)
DEFAULT_CONFIG: dict = {"strategy": "sorted", "block_m": 256}


def search_space() -> list[dict]:
    """Every kernel config the tuner may try."""
    return [{"strategy": s, "block_m": b} for s in STRATEGIES for b in BLOCK_MS]


def device_name() -> str:
    """CPU model name with spaces as underscores (SGLang uses the CUDA device name the same way)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip().replace(" ", "_")
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine() or "unknown_cpu").replace(" ", "_")


def config_file_name(E: int, N: int, device: str, dtype: str | None = None) -> str:
    """SGLang's file naming: E=<experts>,N=<intermediate>,device_name=<dev>[,dtype=<dtype>].json."""
    suffix = f",dtype={dtype}" if dtype is not None else ""
    return f"E={E},N={N},device_name={device}{suffix}.json"


def config_dir() -> Path:
    """Folder searched for config files; SGLANG_MOE_CONFIG_DIR overrides this package's folder."""
    root = os.environ.get("SGLANG_MOE_CONFIG_DIR") or str(Path(__file__).parent)
    return Path(root) / "configs" / ENGINE_VERSION_DIR


def validate_config(config: dict, where: str) -> dict:
    """Reject configs this engine cannot run, naming the file/key at fault."""
    if not isinstance(config, dict):
        raise ValueError(f"{where}: MoE config must be an object, got {config!r}")
    strategy = config.get("strategy")
    if strategy not in STRATEGIES:
        raise ValueError(f"{where}: 'strategy' must be one of {STRATEGIES}, got {strategy!r}")
    block_m = config.get("block_m")
    if not isinstance(block_m, int) or isinstance(block_m, bool) or block_m < 1:
        raise ValueError(f"{where}: 'block_m' must be a positive int, got {block_m!r}")
    return {"strategy": strategy, "block_m": block_m}


@functools.lru_cache(maxsize=None)
def get_moe_configs(E: int, N: int) -> dict[int, dict] | None:
    """Load {batch_size: config} for (E, N) once; None when no file exists (then the default is used)."""
    path = config_dir() / config_file_name(E, N, device_name())
    if not path.is_file():
        logger.warning(
            "Config file not found at %s. Using default MoE kernel config. Performance might be sub-optimal!",
            path.absolute(),
        )
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a non-empty object {{batch_size: config}}")
    configs: dict[int, dict] = {}
    for key, cfg in raw.items():
        try:
            bs = int(key)
        except ValueError as e:
            raise ValueError(f"{path}: batch size key {key!r} is not an integer") from e
        configs[bs] = validate_config(cfg, f"{path} [{key}]")
    logger.info("Using MoE kernel config from %s.", path.absolute())
    return configs


def get_moe_config(E: int, N: int, M: int) -> dict:
    """Config for M tokens: the file's entry with batch size nearest to M (SGLang's rule), else the default."""
    configs = get_moe_configs(E, N)
    if configs is None:
        return dict(DEFAULT_CONFIG)
    return configs[min(configs, key=lambda bs: abs(bs - M))]


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax-then-top-k routing as Qwen3-MoE does; returns (weights [M, k], expert ids [M, k])."""
    if renormalize:  # softmax, top-k, renormalise == softmax over the top-k logits (two ops, not four)
        top, ids = torch.topk(router_logits, top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=torch.float32), ids
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    return torch.topk(probs, top_k, dim=-1)


@dataclass(frozen=True)
class Experts:
    """One MoE layer's expert weights, in the two forms the strategies read.

    gate_up[e] / down[e]: per-expert prepacked projections (`linear.Linear`), for the strategies that
    run one matmul per expert ("loop", "sorted"). w13 [E, H, 2N] (gate columns, then up) and
    w2 [E, N, H]: dense input-major stacks, for "gather_bmm", which indexes weights per token.
    """

    gate_up: list[Linear]
    down: list[Linear]
    w13: torch.Tensor
    w2: torch.Tensor

    @property
    def num_experts(self) -> int:
        return len(self.down)


def pack_experts(gate: list[torch.Tensor], up: list[torch.Tensor], down: list[torch.Tensor]) -> Experts:
    """Per-expert HF weights ([out, in] each: gate_proj, up_proj, down_proj) in both kernel forms."""
    gate_up = [torch.cat([g, u]) for g, u in zip(gate, up)]
    w13 = torch.stack([w.t() for w in gate_up]).contiguous()
    w2 = torch.stack([d.t() for d in down]).contiguous()
    return Experts(
        gate_up=[Linear(w, input_major=w13[e]) for e, w in enumerate(gate_up)],
        down=[Linear(d, input_major=w2[e]) for e, d in enumerate(down)],
        w13=w13,
        w2=w2,
    )


def _expert_mlp(x: torch.Tensor, experts: Experts, e: int) -> torch.Tensor:
    gate, up = experts.gate_up[e](x).chunk(2, dim=-1)
    return experts.down[e](F.silu(gate) * up)


def _loop(hidden, weights, ids, experts: Experts, out) -> None:
    """One pass per expert that received tokens; token lookup with a mask per expert."""
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        y = _expert_mlp(hidden[tok], experts, e) * weights[tok, slot, None]
        out.index_add_(0, tok, y)


def _sorted(hidden, weights, ids, experts: Experts, out) -> None:
    """Sort (token, expert) pairs by expert once, then one matmul per contiguous expert segment."""
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    tok_sorted = order // top_k
    x = hidden[tok_sorted]
    w_sorted = weights.reshape(-1)[order, None]
    ys = []
    start = 0
    for e, n in enumerate(counts):
        if n:
            ys.append(_expert_mlp(x[start : start + n], experts, e))
            start += n
    out.index_add_(0, tok_sorted, torch.cat(ys) * w_sorted)


def _gather_bmm(hidden, weights, ids, experts: Experts, out) -> None:
    """Gather each (token, expert) pair's weights and run one batched matmul (copies the weights)."""
    M, top_k = ids.shape
    flat = ids.reshape(-1)
    x = hidden.repeat_interleave(top_k, dim=0).unsqueeze(1)  # [M*k, 1, H]
    gate, up = torch.bmm(x, experts.w13[flat]).squeeze(1).chunk(2, dim=-1)
    y = torch.bmm((F.silu(gate) * up).unsqueeze(1), experts.w2[flat]).squeeze(1)  # [M*k, H]
    out += (y * weights.reshape(-1, 1)).view(M, top_k, -1).sum(dim=1)


_KERNELS = {"loop": _loop, "sorted": _sorted, "gather_bmm": _gather_bmm}


def fused_moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    experts: Experts,
    top_k: int,
    renormalize: bool,
    config: dict,
) -> torch.Tensor:
    """Route M tokens to top_k of E experts and sum their SiLU-gated MLP outputs.

    hidden [M, H], router_logits [M, E], experts as `pack_experts` builds them.
    `config` = {"strategy": one of STRATEGIES, "block_m": tokens per chunk}.
    """
    kernel = _KERNELS[config["strategy"]]
    block_m = config["block_m"]
    weights, ids = route(router_logits, top_k, renormalize)
    weights = weights.to(hidden.dtype)
    out = torch.zeros_like(hidden)
    M = hidden.shape[0]
    if M <= block_m:  # one block: skip the slicing (decode at small batch is overhead-bound)
        kernel(hidden, weights, ids, experts, out)
        return out
    for s in range(0, M, block_m):
        kernel(hidden[s : s + block_m], weights[s : s + block_m], ids[s : s + block_m], experts, out[s : s + block_m])
    return out
