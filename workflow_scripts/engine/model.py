"""A minimal Qwen3 / Qwen3-MoE decoder with a preallocated, slot-indexed KV cache.

Written by hand rather than using transformers' modules because the engine needs ragged batched
forwards (each row at its own position, T new tokens per row) over a cache it owns, with little
Python overhead per step. Weights are read straight from a transformers save_pretrained folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from workflow_scripts.engine.fused_moe import Experts, fused_moe, get_moe_config, pack_experts
from workflow_scripts.engine.linear import Linear
from workflow_scripts.engine.types import EngineConfigError

SUPPORTED_ARCHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str | torch.dtype, config_dtype: str) -> torch.dtype:
    """SGLang's --dtype: "auto" takes config.json's dtype; float32 and bfloat16 are supported on CPU."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        name = config_dtype if config_dtype in DTYPES else "float32"
    if name not in DTYPES:
        raise EngineConfigError(f"--dtype {name!r} is not supported; choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class ModelConfig:
    """The config.json fields the decoder uses."""

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    num_experts: int
    top_k: int
    norm_topk_prob: bool
    moe_intermediate_size: int
    moe_layers: frozenset[int]
    dtype: str  # as saved in config.json ("dtype", or the older "torch_dtype")


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def load_config(model_dir: Path) -> ModelConfig:
    """Parse config.json (and generation_config.json for EOS), naming the file and key at fault."""
    path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise EngineConfigError(f"model directory {model_dir} does not exist")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise EngineConfigError(f"{path} is missing") from e
    except json.JSONDecodeError as e:
        raise EngineConfigError(f"{path} is not valid JSON: {e}") from e
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHS), None)
    if arch is None:
        raise EngineConfigError(f"{path}: 'architectures' {archs} has none of {SUPPORTED_ARCHS}")
    if raw.get("use_sliding_window"):
        raise EngineConfigError(f"{path}: 'use_sliding_window' is not supported")
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or raw.get("rope_scaling"):
        raise EngineConfigError(f"{path}: only default RoPE is supported, got {rope or raw.get('rope_scaling')}")
    eos = _eos_ids(raw.get("eos_token_id"))
    gen_path = model_dir / "generation_config.json"
    if not eos and gen_path.is_file():
        eos = _eos_ids(json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id"))
    try:
        n_layers = int(raw["num_hidden_layers"])
        num_heads = int(raw["num_attention_heads"])
        is_moe = arch == "Qwen3MoeForCausalLM"
        num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0) if is_moe else 0
        if is_moe and num_experts == 0:
            raise EngineConfigError(f"{path}: MoE model without 'num_experts' / 'num_local_experts'")
        sparse_step = int(raw.get("decoder_sparse_step", 1))
        dense_only = set(raw.get("mlp_only_layers") or [])
        moe_layers = frozenset(
            i for i in range(n_layers) if num_experts and i not in dense_only and (i + 1) % sparse_step == 0
        )
        return ModelConfig(
            arch=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=n_layers,
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=eos,
            num_experts=num_experts,
            top_k=int(raw.get("num_experts_per_tok", 0)) if is_moe else 0,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)) if is_moe else 0,
            moe_layers=moe_layers,
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        )
    except KeyError as e:
        raise EngineConfigError(f"{path}: missing key {e.args[0]!r}") from e


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm; statistics in fp32 as transformers computes them (one fused op in fp32)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@dataclass
class Layer:
    """One decoder layer's weights; the MLP is dense (gate_up/down) or MoE (router/experts)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    gate_up: Linear | None = None
    down: Linear | None = None
    router: Linear | None = None
    experts: Experts | None = None


class KVCache:
    """Per-slot K/V buffers: k[layer] is [slots, kv_heads, capacity, head_dim].

    Row b of a forward uses slot (slot_offset + b); the scheduler keeps running sequences in
    slots 0..B-1 so a batch reads its cache as a plain slice, never a gather.
    """

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, dtype: torch.dtype):
        shape = (slots, cfg.num_kv_heads, capacity, cfg.head_dim)
        # Zeroed, not torch.empty: a batch reads every row up to the longest row's length, and masked
        # positions still enter softmax(QK)V as 0 * V, which is NaN if stale memory holds a NaN pattern.
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_layers)]
        self.capacity = capacity

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot src into slot dst (compaction after a finish)."""
        for buf in (*self.k, *self.v):
            buf[dst, :, :length] = buf[src, :, :length]


@dataclass(frozen=True)
class Segment:
    """Rows of one forward that feed the same number of tokens: tokens [b, t] for slots slot..slot+b-1.

    Row i's tokens go to positions start[i]..start[i]+t-1 of its slot.
    """

    tokens: torch.Tensor
    start: torch.Tensor
    slot: int


@dataclass(frozen=True)
class _AttentionPlan:
    """Per-segment attention inputs, computed once per forward rather than once per layer."""

    positions: torch.Tensor  # [b, t]
    kv_len: int
    mask: torch.Tensor | None
    rows: torch.Tensor | None  # slot index per token for the cache write; None for a single row


class DecoderModel:
    """Qwen3 (dense) or Qwen3-MoE causal LM, inference only."""

    def __init__(self, model_dir: Path, dtype: str | torch.dtype = "auto"):
        self.path = Path(model_dir)
        self.cfg = cfg = load_config(self.path)
        self.dtype = resolve_dtype(dtype, cfg.dtype)
        weights_path = self.path / "model.safetensors"
        if not weights_path.is_file():
            raise EngineConfigError(f"{weights_path} is missing (sharded checkpoints are not supported)")
        try:
            sd = load_file(str(weights_path))
        except Exception as e:  # safetensors raises several error types for a corrupt file
            raise EngineConfigError(f"{weights_path} cannot be read: {e}") from e
        self._sd = sd
        self.embed = self._take("model.embed_tokens.weight")
        self.final_norm = self._take("model.norm.weight")
        self.lm_head = Linear(self.embed if cfg.tie_word_embeddings else self._take("lm_head.weight"))
        if self.embed.shape[0] != cfg.vocab_size:
            raise EngineConfigError(f"{weights_path}: embedding rows {self.embed.shape[0]} != vocab_size {cfg.vocab_size}")
        self.layers = [self._load_layer(i) for i in range(cfg.num_layers)]
        del self._sd
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        self._inv_freq = inv_freq
        self._rope_len = 0
        self._cos = self._sin = torch.empty(0)
        self.scale = cfg.head_dim**-0.5

    def _take(self, name: str) -> torch.Tensor:
        try:
            return self._sd[name].to(self.dtype).contiguous()
        except KeyError as e:
            raise EngineConfigError(f"{self.path / 'model.safetensors'}: tensor {name!r} is missing") from e

    def _linear(self, *names: str) -> Linear:
        """HF [out, in] projections, concatenated along out, as one projection."""
        return Linear(torch.cat([self._take(n) for n in names]))

    def _load_layer(self, i: int) -> Layer:
        p = f"model.layers.{i}."
        layer = Layer(
            input_norm=self._take(p + "input_layernorm.weight"),
            post_norm=self._take(p + "post_attention_layernorm.weight"),
            qkv=self._linear(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
            o=self._linear(p + "self_attn.o_proj.weight"),
            q_norm=self._take(p + "self_attn.q_norm.weight"),
            k_norm=self._take(p + "self_attn.k_norm.weight"),
        )
        if i in self.cfg.moe_layers:
            m = p + "mlp."
            E = self.cfg.num_experts
            layer.router = self._linear(m + "gate.weight")
            layer.experts = pack_experts(
                *([self._take(f"{m}experts.{e}.{proj}.weight") for e in range(E)] for proj in ("gate_proj", "up_proj", "down_proj"))
            )
        else:
            layer.gate_up = self._linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            layer.down = self._linear(p + "mlp.down_proj.weight")
        return layer

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        """A cache for `slots` sequences of up to `capacity` positions each."""
        return KVCache(self.cfg, slots, capacity, self.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = int(positions.max()) + 1
        if need > self._rope_len:
            n = max(need, 2 * self._rope_len, 256)
            freqs = torch.outer(torch.arange(n, dtype=torch.float32), self._inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            # rotate_half(x) * sin == roll(x, D/2) * [-sin | sin]: one op fewer per use
            half = self.cfg.head_dim // 2
            signed_sin = torch.cat((-emb.sin()[:, :half], emb.sin()[:, half:]), dim=-1)
            self._cos, self._sin, self._rope_len = emb.cos().to(self.dtype), signed_sin.to(self.dtype), n
        return self._cos[positions], self._sin[positions]

    def forward(self, tokens: torch.Tensor, start: torch.Tensor, cache: KVCache, slot_offset: int = 0) -> torch.Tensor:
        """Run tokens [B, T] for rows whose caches already hold start[b] positions; return final hidden [B, T, H].

        Row b's tokens go to positions start[b]..start[b]+T-1 of slot slot_offset+b. Rows with fewer
        real tokens may be right-padded: padded positions write cache entries beyond the row's
        length, which no later query reads before they are overwritten.
        """
        return self.forward_segments([Segment(tokens, start, slot_offset)], cache)[0]

    @torch.inference_mode()
    def forward_segments(self, segments: list[Segment], cache: KVCache) -> list[torch.Tensor]:
        """One forward over several segments (decode rows, prefill chunks); the final hidden [b, t, H] of each.

        Projections, MoE and norms run once over every segment's tokens packed together, so a forward
        that mixes prefill chunks into a decode batch reads each weight once; only attention (and the
        cache write) runs per segment, over that segment's own contiguous slots.
        """
        cfg = self.cfg
        plans = [self._plan(seg, cache) for seg in segments]
        sizes = [seg.tokens.numel() for seg in segments]
        one = len(segments) == 1
        flat = segments[0].tokens.reshape(-1) if one else torch.cat([seg.tokens.reshape(-1) for seg in segments])
        positions = plans[0].positions.reshape(-1) if one else torch.cat([p.positions.reshape(-1) for p in plans])
        cos, sin = self._rope(positions)
        cos, sin = cos[:, None], sin[:, None]  # [N, 1, D]
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        half = hd // 2
        N = flat.shape[0]
        h = F.embedding(flat, self.embed)  # [N, H]
        for li, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = layer.qkv(x).split((nh * hd, nkv * hd, nkv * hd), dim=-1)
            q = rms_norm(q.view(N, nh, hd), layer.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k.view(N, nkv, hd), layer.k_norm, cfg.rms_norm_eps)
            q = q * cos + q.roll(half, -1) * sin
            k = k * cos + k.roll(half, -1) * sin
            v = v.view(N, nkv, hd)
            if one:
                attn = self._attend(li, segments[0], plans[0], q, k, v, cache)
            else:
                parts = zip(segments, plans, q.split(sizes), k.split(sizes), v.split(sizes))
                attn = torch.cat([self._attend(li, *part, cache) for part in parts])
            h = h + layer.o(attn)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            h = h + self._mlp(layer, x)
        h = rms_norm(h, self.final_norm, cfg.rms_norm_eps)
        return [part.view(*seg.tokens.shape, -1) for seg, part in zip(segments, h.split(sizes))]

    def _plan(self, seg: Segment, cache: KVCache) -> _AttentionPlan:
        B, T = seg.tokens.shape
        positions = seg.start[:, None] + torch.arange(T)[None, :]  # [B, T]
        kv_len = int(positions.max()) + 1
        if kv_len > cache.capacity:
            raise ValueError(f"position {kv_len - 1} exceeds KV cache capacity {cache.capacity}")
        # a single sequence decoding one token sees its whole cache: no mask needed
        mask = None if B == T == 1 else torch.arange(kv_len)[None, None, None, :] <= positions[:, None, :, None]
        rows = torch.arange(seg.slot, seg.slot + B)[:, None].expand(B, T) if B > 1 else None
        return _AttentionPlan(positions, kv_len, mask, rows)

    def _attend(self, li: int, seg: Segment, plan: _AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cache: KVCache) -> torch.Tensor:
        """Write one segment's K/V [b*t, kv_heads, D] into its slots and attend; returns [b*t, heads*D]."""
        B, T = seg.tokens.shape
        nh, hd = self.cfg.num_heads, self.cfg.head_dim
        kc, vc = cache.k[li], cache.v[li]
        if plan.rows is None:  # one row: a plain slice copy beats advanced-index writes
            start0 = int(seg.start[0])
            kc[seg.slot, :, start0 : start0 + T] = k.transpose(0, 1)
            vc[seg.slot, :, start0 : start0 + T] = v.transpose(0, 1)
        else:
            kc[plan.rows, :, plan.positions] = k.view(B, T, *k.shape[1:])
            vc[plan.rows, :, plan.positions] = v.view(B, T, *v.shape[1:])
        keys = kc[seg.slot : seg.slot + B, :, : plan.kv_len]
        values = vc[seg.slot : seg.slot + B, :, : plan.kv_len]
        q = q.view(B, T, nh, hd).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=plan.mask, scale=self.scale,
                                              enable_gqa=nh != self.cfg.num_kv_heads)
        return attn.transpose(1, 2).reshape(B * T, nh * hd)

    def _mlp(self, layer: Layer, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H]."""
        if layer.experts is None:
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            return layer.down(F.silu(gate) * up)
        cfg = self.cfg
        config = get_moe_config(cfg.num_experts, cfg.moe_intermediate_size, x.shape[0])
        return fused_moe(x, layer.router(x), layer.experts, cfg.top_k, cfg.norm_topk_prob, config)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head in fp32 (sampling wants full precision)."""
        return self.lm_head(hidden).float()
