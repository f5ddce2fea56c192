"""The smoke pair as the rest of the study sees it: loadable, deterministic, documented."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from workflow_scripts.models.tokenizer import EOS_TOKEN, IM_END, IM_START


def _info(model_dir: Path) -> dict:
    return json.loads((model_dir / "build_info.json").read_text())


def test_pair_loads_with_transformers_and_shares_one_tokenizer(smoke_pair):
    target_dir, draft_dir = smoke_pair
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    assert type(target).__name__ == "Qwen3MoeForCausalLM" and target.config.model_type == "qwen3_moe"
    assert type(draft).__name__ == "Qwen3ForCausalLM" and draft.config.model_type == "qwen3"
    assert target.config.num_experts >= 16 and target.config.num_experts_per_tok >= 2
    assert draft.config.num_hidden_layers <= 2 and draft.config.hidden_size <= 256
    assert (target_dir / "tokenizer.json").read_bytes() == (draft_dir / "tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(target_dir)
    eos_id = tok.convert_tokens_to_ids(EOS_TOKEN)
    for model in (target, draft):
        assert model.config.eos_token_id == eos_id == tok.eos_token_id
        assert model.generation_config.eos_token_id == eos_id
        assert model.config.vocab_size == len(tok)
    text = "def parse(value):\n    return value\n"
    ids = tok(text, return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == text  # byte-level: exact round trip
    with torch.no_grad():
        assert target(ids).logits.shape == draft(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_chat_template_renders_chatml_with_one_id_per_marker(smoke_pair):
    """transformers' apply_chat_template (what SGLang calls for /v1/chat/completions) works on the built pair."""
    target_dir, draft_dir = smoke_pair
    configs = [json.loads((d / "tokenizer_config.json").read_text()) for d in (target_dir, draft_dir)]
    assert configs[0]["chat_template"] == configs[1]["chat_template"]  # in the file every transformers reads
    tok = AutoTokenizer.from_pretrained(target_dir)
    messages = [{"role": "system", "content": "Answer in code."}, {"role": "user", "content": "def add(a, b):"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nAnswer in code.<|im_end|>\n<|im_start|>user\ndef add(a, b):<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    start, end = tok.convert_tokens_to_ids([IM_START, IM_END])
    assert {start, end}.isdisjoint({tok.eos_token_id, tok.pad_token_id}) and max(start, end) < len(tok)
    assert ids.count(start) == 3 and ids.count(end) == 2 and ids[0] == start  # single ids, never split into bytes
    assert tok.decode(ids, skip_special_tokens=True) == "system\nAnswer in code.\nuser\ndef add(a, b):\nassistant\n"
    assert tok.eos_token == EOS_TOKEN  # as Qwen's base models: the chat markers do not change EOS


def test_legacy_config_keys_agree_with_transformers_view(smoke_pair):
    """SGLang builds on transformers 4.x read num_experts/rope_theta; they must match what 5.x sees."""
    target_dir, _ = smoke_pair
    raw = json.loads((target_dir / "config.json").read_text())
    cfg = AutoConfig.from_pretrained(target_dir)
    assert raw["num_experts"] == raw["num_local_experts"] == cfg.num_experts
    assert raw["rope_theta"] == cfg.rope_parameters["rope_theta"]


def test_same_seed_builds_bitwise_identical_weights(smoke_pair, second_smoke_pair):
    for first, second in zip(smoke_pair, second_smoke_pair):
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (first / name).read_bytes() == (second / name).read_bytes(), (
                f"{name} differs between two builds of the same seed "
                "(a stale SPECSTUDY_SMOKE_PAIR_CACHE also causes this)")


def test_build_info_is_complete_and_sane(smoke_pair):
    target_dir, draft_dir = smoke_pair
    target, draft = _info(target_dir), _info(draft_dir)
    for info in (target, draft):
        assert info["preset"] == "smoke" and isinstance(info["seed"], int)
        assert info["python_version"] == sys.version.split()[0]
        assert len(info["corpus"]["file_list_sha256"]) == 64
        assert info["corpus"]["n_train_files"] > info["corpus"]["n_val_files"] > 0
        assert info["corpus"]["n_train_docs"] > 0 and info["corpus"]["n_val_docs"] > 0
        assert 0 < info["validation_loss"] < math.log(info["tokenizer"]["vocab_size"])
        assert info["tokens_seen"] > 0 and info["train_wall_s"] > 0 and info["build_wall_s"] > 0
        assert info["num_threads"] == info["settings"]["num_threads"]
    assert 0.0 <= target["draft_target_top1_agreement"] <= 1.0
    assert target["draft_target_top1_agreement"] == draft["draft_target_top1_agreement"]
    quality = target["quality"]
    assert 0.0 <= quality["greedy_continuation_agreement"] <= 1.0 and quality["greedy_continuation_tokens"] > 0
    lengths = list(quality["predicted_accept_length_by_steps"].values())
    assert 1.0 <= lengths[0] <= lengths[1] <= lengths[2] <= 4.0
    assert target["corpus"] == draft["corpus"]
    assert target["parameters"]["total"] > target["parameters"]["active"] > draft["parameters"]["total"]
    assert draft["parameters"]["total"] == draft["parameters"]["active"]
    assert target["model"]["num_experts"] >= 16 and target["model"]["num_experts_per_tok"] >= 2
    routing = target["routing"]
    # Non-degenerate routing: 3 consecutive tokens touch clearly more experts than one token does.
    assert routing["distinct_experts_per_3_tokens_mean"] > routing["distinct_experts_per_3_tokens_if_degenerate"] + 1


def test_outputs_are_complete_and_no_temp_dirs_remain(smoke_pair):
    target_dir, draft_dir = smoke_pair
    needed = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "build_info.json"}
    assert needed | {"heldout.jsonl"} <= {p.name for p in target_dir.iterdir()}
    assert needed <= {p.name for p in draft_dir.iterdir()}
    leftovers = [p.name for p in target_dir.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_heldout_jsonl_holds_the_validation_documents(smoke_pair):
    target_dir, _ = smoke_pair
    lines = (target_dir / "heldout.jsonl").read_text().splitlines()
    docs = [json.loads(line)["text"] for line in lines]
    assert len(docs) == _info(target_dir)["corpus"]["n_val_docs"]
    assert all(EOS_TOKEN not in d and d.lstrip().startswith(("def ", "class ", "async def ", "@")) for d in docs)


def test_rebuild_replaces_an_existing_output_dir(tmp_path):
    """A second build over the same dirs swaps the new ones in and leaves no temp or old dirs behind."""
    from workflow_scripts.models.build import build_pair

    small = {"dense_steps": "2", "moe_steps": "1", "draft_steps": "2", "eval_tokens": "512", "max_files": "30"}
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    (target / "stale.txt").write_text("from an earlier build")
    build_pair("smoke", 3, target, draft, small)
    assert not (target / "stale.txt").exists() and (target / "build_info.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "target"]


@pytest.mark.parametrize("overrides, fragment", [
    ({"num_experts": "8"}, "num_experts=8"),
    ({"no_such_key": "1"}, "no_such_key"),
    ({"dense_lr": "fast"}, "dense_lr"),
    ({"train_dtype": "float16"}, "train_dtype"),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, overrides, fragment):
    from workflow_scripts.models.build import build_pair

    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match=fragment):
        build_pair("smoke", 0, target, tmp_path / "draft", overrides)
    assert (target / "keep.txt").read_text() == "precious"
    assert not (tmp_path / "draft").exists()


def test_auto_train_dtype_follows_the_cpu(monkeypatch):
    """`auto` trains in bf16 only where the CPU computes it natively (emulated bf16 made an AVX2-only build 10x
    slower); the resolved dtype, not "auto", is what build_info records."""
    from workflow_scripts.models import presets

    assert presets.PRESETS["default"].train_dtype == "auto"
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(presets, "native_bf16", lambda native=native: native)
        assert presets.resolve("default").train_dtype == expected
        assert presets.resolve("default", {"train_dtype": "float32"}).train_dtype == "float32"
