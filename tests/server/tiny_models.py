"""Tiny random Qwen3-MoE target, dense Qwen3 drafts and a byte-level BPE tokenizer, built in about a second.

The server tests need real model directories in Hugging Face format, not trained ones: random weights give
arbitrary but deterministic greedy text, which is all the HTTP layer needs.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from workflow_scripts.models.tokenizer import EOS_TOKEN as EOS
from workflow_scripts.models.tokenizer import SPECIAL_TOKENS, save_tokenizer

# Long enough that a 2000-token request outlives a client that disconnects after its first chunk.
MAX_POSITIONS = 4096


def _train_tokenizer(vocab_size: int) -> Tokenizer:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = [(stdlib / name).read_text(encoding="utf-8") for name in ("textwrap.py", "string.py", "bisect.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(text, trainer)
    return tok


def _save(model: torch.nn.Module, tok: Tokenizer, out: Path) -> Path:
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)  # tokenizer.json and tokenizer_config.json with the study's ChatML template
    return out


def build_tiny_models(root: Path) -> dict[str, Path]:
    """Write target/, draft/ (same vocabulary) and draft_bad_vocab/ under root; returns their paths."""
    tok = _train_tokenizer(vocab_size=384)
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id(EOS)
    shared = dict(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=MAX_POSITIONS, eos_token_id=eos_id, tie_word_embeddings=False, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    target = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            **shared, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=64, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True,
        )  # fmt: skip
    )
    draft = Qwen3ForCausalLM(Qwen3Config(**shared, num_hidden_layers=1, intermediate_size=128))
    bad = Qwen3ForCausalLM(
        Qwen3Config(**{**shared, "vocab_size": vocab + 8}, num_hidden_layers=1, intermediate_size=64)
    )
    paths = {
        "target": _save(target, tok, root / "target"),
        "draft": _save(draft, tok, root / "draft"),
        "draft_bad_vocab": _save(bad, tok, root / "draft_bad_vocab"),
    }
    (root / "build_info.json").write_text(json.dumps({"vocab_size": vocab, "eos_token_id": eos_id}))
    return paths
