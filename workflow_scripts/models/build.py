"""Build the embedded model pair: a Qwen3-MoE target and a dense Qwen3 draft, deterministic from a seed.

Pipeline: stdlib corpus -> byte-level BPE -> dense Qwen3 trained on the corpus -> sparse upcycle into the
MoE target (+ a short fine-tune so routing is real) -> 1-layer draft warm-started from the dense model and
distilled on the target's logits -> held-out evaluation -> both dirs written atomically.

CLI: python -m workflow_scripts.models.build --preset {smoke,default} --seed INT --target-out DIR --draft-out DIR
     [--set key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer

from workflow_scripts.models import architecture, corpus, distill, evaluate, presets, tokenizer, training
from workflow_scripts.models.presets import BuildSettings


@contextlib.contextmanager
def _deterministic_torch(num_threads: int) -> Iterator[None]:
    """Fixed threads and deterministic kernels while building; the caller's settings come back after."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Record the wall time of one build phase into `phases` (reported in build_info.json)."""
    start = time.perf_counter()
    yield
    phases[name] = round(time.perf_counter() - start, 1)


def _definition_head(doc: str) -> str:
    """The first two lines of a held-out definition (signature, docstring start): a realistic prompt."""
    return "\n".join(doc.splitlines()[:2]) + "\n"


def _log(message: str) -> None:
    print(f"[models.build] {message}", file=sys.stderr, flush=True)


def _param_counts(model: torch.nn.Module) -> dict[str, int]:
    """Total parameters, and those one token uses (for an MoE: top-k of the experts)."""
    total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    n_experts = getattr(cfg, "num_experts", None)
    if n_experts is None:
        return {"total": total, "active": total}
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    unused = (n_experts - cfg.num_experts_per_tok) * expert * cfg.num_hidden_layers
    return {"total": total, "active": total - unused}


def _shape(model: torch.nn.Module) -> dict:
    cfg = model.config
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok"]
    return {"architecture": cfg.architectures[0] if cfg.architectures else type(model).__name__,
            "model_type": cfg.model_type, **{k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}}


def _add_legacy_config_keys(config_path: Path) -> None:
    """Also write the transformers 4.x names of renamed fields, so SGLang builds pinned to 4.x read the
    same model (4.x would otherwise default num_experts to 128); transformers 5 reads both forms."""
    config = json.loads(config_path.read_text())
    if "num_local_experts" in config:
        config["num_experts"] = config["num_local_experts"]
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["torch_dtype"] = config["dtype"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_model_dir(out: Path, model: torch.nn.Module, tok: Tokenizer, info: dict,
                     extra_files: dict[str, str]) -> None:
    """Save into a temp dir beside `out`, then swap it in: a crash never leaves a complete-looking dir."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        _add_legacy_config_keys(tmp / "config.json")
        tokenizer.save_tokenizer(tok, tmp)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
        (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
        _apply_umask(tmp)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _apply_umask(directory: Path) -> None:
    """mkdtemp and save_pretrained create owner-only modes; give the outputs ordinary ones."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def _check_outputs(target_out: Path, draft_out: Path) -> None:
    if target_out.resolve() == draft_out.resolve():
        raise ValueError(f"--target-out and --draft-out are the same path: {target_out}")
    for flag, path in (("--target-out", target_out), ("--draft-out", draft_out)):
        if path.exists() and not path.is_dir():
            raise ValueError(f"{flag} {path} exists and is not a directory")


def build_pair(preset: str, seed: int, target_out: Path, draft_out: Path,
               overrides: dict[str, str] | None = None) -> None:
    """Build the pair of `preset` (with `--set`-style `overrides`) from `seed` into the two dirs."""
    settings = presets.resolve(preset, overrides)
    target_out, draft_out = Path(target_out), Path(draft_out)
    _check_outputs(target_out, draft_out)
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
    with _deterministic_torch(settings.num_threads):
        _build(preset, settings, seed, target_out, draft_out)


def _build(preset: str, s: BuildSettings, seed: int, target_out: Path, draft_out: Path) -> None:
    start = time.perf_counter()
    phases: dict[str, float] = {}

    with _timed(phases, "corpus_and_tokenizer"):
        data = corpus.build_corpus(s.max_files)
        tok = tokenizer.train_tokenizer(data.train_docs, s.vocab_size)
        eos = architecture.EOS_ID
        if tok.token_to_id(tokenizer.EOS_TOKEN) != eos:
            raise RuntimeError(f"tokenizer put {tokenizer.EOS_TOKEN} at id {tok.token_to_id(tokenizer.EOS_TOKEN)}")
        train_stream = training.token_stream(tok, data.train_docs, eos, seed=seed)
        val_stream = training.token_stream(tok, data.val_docs, eos)
        val_windows = training.sequential_windows(val_stream, s.seq_len, s.eval_tokens)
    _log(f"corpus: {len(data.train_files)} train / {len(data.val_files)} val files, {len(data.train_docs)} / "
        f"{len(data.val_docs)} docs, {len(train_stream)} / {len(val_stream)} tokens")
    common = dict(warmup_steps=s.warmup_steps, weight_decay=s.weight_decay, dtype=s.train_dtype,
                  tokens_per_step=s.batch_size * s.seq_len)

    # 1. dense model: the quality of the whole pair comes from here
    dense = architecture.new_model(architecture.dense_config(s), seed)
    dense_stats = training.train(
        dense, training.random_windows(train_stream, s.batch_size, s.seq_len, seed),
        lambda b: dense(input_ids=b, labels=b).loss, steps=s.dense_steps, lr=s.dense_lr, desc="dense", **common)

    # 2. upcycle to the MoE target, short fine-tune (LM loss + load balancing) so routing specialises
    target = architecture.upcycle(dense, s, seed + 1)
    moe_stats = training.train(
        target, training.random_windows(train_stream, s.batch_size, s.seq_len, seed + 1),
        lambda b: target(input_ids=b, labels=b, output_router_logits=True).loss,
        steps=s.moe_steps, lr=s.moe_lr, desc="moe fine-tune", **common)
    target.requires_grad_(False)

    # 3. draft: warm start from the dense model, then distil on the target's labels of a fixed window set
    draft = architecture.new_model(architecture.draft_config(s), seed + 2)
    architecture.warm_start_draft(draft, dense)
    n_windows = s.distill_tokens // s.seq_len
    distill_windows = next(training.random_windows(train_stream, n_windows, s.seq_len, seed + 2))
    with _timed(phases, "teacher_labels"):
        labels = distill.label_windows(target, distill_windows, s.distill_top_k, s.train_dtype, s.batch_size)
    draft_stats = training.train(
        draft, training.shuffled_batches(n_windows, s.batch_size, seed + 2),
        lambda idx: distill.distill_loss(draft, labels, idx),
        steps=s.draft_steps, lr=s.draft_lr, desc="draft distil", **common)

    # 4. held-out quality, in fp32 on the weights as saved
    _log("evaluating on held-out text")
    with _timed(phases, "evaluate"):
        target_logits, routing = evaluate.target_pass(target, val_windows)
        draft_logits = evaluate.logits_of(draft, val_windows)
        quality = {
            "eval_tokens": val_windows.numel(),
            "target_val_loss": round(evaluate.next_token_loss(target_logits, val_windows), 4),
            "draft_val_loss": round(evaluate.next_token_loss(draft_logits, val_windows), 4),
            "dense_val_loss_before_upcycle": round(
                evaluate.next_token_loss(evaluate.logits_of(dense, val_windows), val_windows), 4),
            "draft_target_top1_agreement": round(evaluate.top1_agreement(draft_logits, target_logits), 4),
        }
        heads = [tok.encode(_definition_head(d)).ids for d in data.val_docs[: s.greedy_eval_prompts]]
        quality.update(evaluate.greedy_continuation_agreement(target, draft, heads, s.greedy_eval_tokens, eos))
    _log(f"quality: {quality}; routing: {routing['distinct_experts_per_3_tokens_mean']} distinct experts "
        f"per 3 tokens (uniform {routing['distinct_experts_per_3_tokens_if_uniform_random']})")

    # 5. write both dirs; build_info is the record of how and how well
    target.config.output_router_logits = False
    common_info = {
        "preset": preset,
        "seed": seed,
        "settings": dataclasses.asdict(s),
        "python_version": data.python_version,
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "num_threads": s.num_threads,
        "corpus": {
            "source": "stdlib of the running interpreter",
            "file_list_sha256": data.file_list_sha256,
            "content_sha256": data.content_sha256,
            "split_salt": corpus.SPLIT_SALT,
            "val_fraction": corpus.VAL_FRACTION,
            "doc_chars_min_max": [corpus.MIN_CHARS, corpus.MAX_CHARS],
            "n_train_files": len(data.train_files),
            "n_val_files": len(data.val_files),
            "n_unparsable_files": data.n_unparsable,
            "n_train_docs": len(data.train_docs),
            "n_val_docs": len(data.val_docs),
            "n_train_tokens": len(train_stream),
            "n_val_tokens": len(val_stream),
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tok.get_vocab_size(),
                      "eos_token": tokenizer.EOS_TOKEN, "eos_token_id": eos,
                      "pad_token": tokenizer.PAD_TOKEN, "pad_token_id": architecture.PAD_ID,
                      "special_tokens": tokenizer.SPECIAL_TOKENS, "chat_template": "ChatML"},
        "draft_target_top1_agreement": quality["draft_target_top1_agreement"],
        "quality": quality,
        "training": {"dense": dataclasses.asdict(dense_stats), "moe_finetune": dataclasses.asdict(moe_stats),
                     "draft_distill": {**dataclasses.asdict(draft_stats), "teacher_labelled_tokens": labels.windows.numel()}},
    }
    wall = round(time.perf_counter() - start, 1)
    common_info["phase_wall_s"] = {**phases, "dense": round(dense_stats.wall_s, 1),
                                   "moe_finetune": round(moe_stats.wall_s, 1),
                                   "draft_distill": round(draft_stats.wall_s, 1), "total_before_write": wall}
    target_info = {
        **common_info, "role": "target", "model": _shape(target), "parameters": _param_counts(target),
        "validation_loss": quality["target_val_loss"], "routing": routing,
        "tokens_seen": dense_stats.tokens_seen + moe_stats.tokens_seen,
        "train_wall_s": round(dense_stats.wall_s + moe_stats.wall_s, 1),
        "upcycling": "dense MLP copied into every expert with relative noise expert_noise, random router "
                     "(router_init_std), then moe_steps of LM + load-balancing fine-tune",
        "build_wall_s": wall,
    }
    draft_info = {
        **common_info, "role": "draft", "model": _shape(draft), "parameters": _param_counts(draft),
        "validation_loss": quality["draft_val_loss"],
        "tokens_seen": draft_stats.tokens_seen, "train_wall_s": round(draft_stats.wall_s, 1),
        "distillation": "warm start from the dense model's embeddings/first layers/LM head, then cross-entropy "
                        "against the target's renormalised top-k (distill_top_k) distribution on distill_tokens "
                        "training tokens labelled once, for draft_steps steps",
        "build_wall_s": wall,
    }
    heldout = "".join(json.dumps({"text": d}) + "\n" for d in data.val_docs)
    _write_model_dir(draft_out, draft, tok, draft_info, {})
    _write_model_dir(target_out, target, tok, target_info, {"heldout.jsonl": heldout})
    _log(f"wrote {target_out} and {draft_out} in {wall} s")


class _OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line naming the flag, as the other CLIs of the study do."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parse_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m workflow_scripts.models.build", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", required=True, choices=sorted(presets.PRESETS))
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--target-out", required=True, type=Path)
    parser.add_argument("--draft-out", required=True, type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one preset setting (repeatable)")
    args = parser.parse_args(argv)
    try:
        build_pair(args.preset, args.seed, args.target_out, args.draft_out, _parse_set(args.set))
    except (ValueError, FileNotFoundError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
