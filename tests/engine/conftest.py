"""Tiny random Qwen3-MoE target and Qwen3 drafts, saved with transformers, shared by the engine tests."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from workflow_scripts.engine.scheduler import Scheduler
from workflow_scripts.engine.types import SamplingParams, TokenEvent

VOCAB = 96
# A large init std makes routing and next-token choices vary from token to token (std 0.02 collapses).
INIT_STD = 0.3


def moe_config(**overrides) -> Qwen3MoeConfig:
    kw = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=512, initializer_range=INIT_STD, norm_topk_prob=True, rope_theta=5000.0,
    )
    kw.update(overrides)
    return Qwen3MoeConfig(**kw)


def save(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save(Qwen3MoeForCausalLM(moe_config()).eval(), tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="session")
def mixed_target_dir(tmp_path_factory) -> Path:
    """An MoE with a dense layer (mlp_only_layers) and un-renormalised top-k weights."""
    torch.manual_seed(3)
    cfg = moe_config(mlp_only_layers=[1], norm_topk_prob=False, tie_word_embeddings=True)
    return save(Qwen3MoeForCausalLM(cfg).eval(), tmp_path_factory.mktemp("mixed"))


@pytest.fixture(scope="session")
def dense_draft_dir(tmp_path_factory) -> Path:
    """An unrelated dense draft: mostly rejected proposals."""
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, initializer_range=INIT_STD)
    return save(Qwen3ForCausalLM(cfg).eval(), tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="session")
def near_draft_dir(target_dir, tmp_path_factory) -> Path:
    """The target's weights plus noise: a draft that is accepted often but not always."""
    out = tmp_path_factory.mktemp("near_draft")
    shutil.copy(target_dir / "config.json", out / "config.json")
    g = torch.Generator().manual_seed(2)
    sd = load_file(str(target_dir / "model.safetensors"))
    save_file({k: v + 0.08 * torch.randn(v.shape, generator=g) for k, v in sd.items()}, str(out / "model.safetensors"))
    return out


def with_config(src: Path, dst: Path, **changes) -> Path:
    """A copy of a model folder with config.json fields changed."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 14) -> list[list[int]]:
    """n random prompts; prompts(k) is a prefix of prompts(n) for k < n."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(torch.randint(0, VOCAB, (length,), generator=g).tolist())
    return out


class Collector:
    """Gathers TokenEvents per request; `wait` blocks (bounded) until all expected requests finish."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.final: dict[str, TokenEvent] = {}
        self.events: dict[str, list[TokenEvent]] = {}
        self._cond = threading.Condition()

    def sink(self, ev: TokenEvent) -> None:
        with self._cond:
            self.tokens.setdefault(ev.rid, []).extend(ev.new_ids)
            self.events.setdefault(ev.rid, []).append(ev)
            if ev.finished:
                self.final[ev.rid] = ev
                self._cond.notify_all()

    def wait(self, rids, timeout: float = 60.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: all(r in self.final for r in rids), timeout), (
                f"unfinished: {[r for r in rids if r not in self.final]}"
            )


def run_engine(engine: Scheduler, batch: list[list[int]],
               params: SamplingParams) -> tuple[list[list[int]], list[TokenEvent]]:
    """Submit all prompts at once to a started engine; return outputs and final events in prompt order."""
    col = Collector()
    rids = [f"r{i}" for i in range(len(batch))]
    for rid, p in zip(rids, batch):
        engine.submit(rid, p, params, col.sink)
    col.wait(rids)
    return [col.tokens.get(r, []) for r in rids], [col.final[r] for r in rids]


@pytest.fixture
def engine_factory():
    """Build and start engines; stops them all at the end of the test."""
    made: list[Scheduler] = []

    def make(*args, **kwargs) -> Scheduler:
        kwargs.setdefault("num_threads", 1)
        e = Scheduler(*args, **kwargs)
        e.start()
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop()
