"""Prompts for the two workloads, identical for every setting so outputs can be compared token by token.

- synthetic: random token ids of a fixed length (SGLang's `random-ids` dataset), sent as `input_ids`;
- realistic: the head of a held-out stdlib definition (its signature and docstring, or its first lines), sent as
  text; the model writes the body and stops on its own EOS.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    input_ids: list[int] | None = None
    text: str | None = None


def load_tokenizer(model_dir: Path) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json; the workload needs the model's tokenizer to size prompts")
    return Tokenizer.from_file(str(path))


def synthetic_prompts(tokenizer: Tokenizer, num_prompts: int, input_len: int, seed: int) -> list[Prompt]:
    """Random ids drawn from the ordinary (non-special) vocabulary, so no prompt contains an EOS. Each also
    carries its decoded text, for the chat API (a message is text; the ids go to /generate and /v1/completions)."""
    special = {tok_id for tok_id, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    vocab = sorted(set(range(tokenizer.get_vocab_size())) - special)
    rng = random.Random(seed)
    id_lists = [[rng.choice(vocab) for _ in range(input_len)] for _ in range(num_prompts)]
    return [Prompt(i, input_ids=ids, text=tokenizer.decode(ids)) for i, ids in enumerate(id_lists)]


def definition_head(doc: str) -> str:
    """Signature plus docstring when there is one, else the first three lines: what a user would type before
    asking for the rest."""
    lines = doc.splitlines()
    for i, line in enumerate(lines[:12]):
        stripped = line.strip()
        for quote in ('"""', "'''"):
            if stripped.startswith(quote):
                rest = stripped[3:]
                if quote in rest:
                    return "\n".join(lines[: i + 1]) + "\n"
                for j in range(i + 1, min(len(lines), i + 30)):
                    if quote in lines[j]:
                        return "\n".join(lines[: j + 1]) + "\n"
    return "\n".join(lines[:3]) + "\n"


def heldout_documents(model_dir: Path) -> list[str]:
    """The held-out documents the model was built beside (embedded pair), else the corpus module's own split."""
    path = Path(model_dir) / "heldout.jsonl"
    if path.is_file():
        with open(path) as fh:
            return [json.loads(line)["text"] for line in fh if line.strip()]
    from workflow_scripts.models.corpus import heldout_documents as corpus_heldout

    return corpus_heldout()


def realistic_prompts(
    tokenizer: Tokenizer, docs: list[str], num_prompts: int, input_len: int, seed: int
) -> list[Prompt]:
    """Heads of a seeded sample of held-out definitions, cut to at most `input_len` tokens."""
    if not docs:
        raise ValueError("realistic workload: no held-out documents to cut prompts from")
    rng = random.Random(seed)
    order = rng.sample(range(len(docs)), k=min(len(docs), num_prompts))
    prompts = []
    for i in range(num_prompts):
        head = definition_head(docs[order[i % len(order)]])
        ids = tokenizer.encode(head, add_special_tokens=False).ids[:input_len]
        prompts.append(Prompt(i, text=tokenizer.decode(ids, skip_special_tokens=False)))
    return prompts


def build_prompts(workload: dict, model_dir: Path) -> list[Prompt]:
    tokenizer = load_tokenizer(model_dir)
    if workload["kind"] == "synthetic":
        return synthetic_prompts(tokenizer, workload["num_prompts"], workload["input_len"], workload["seed"])
    docs = heldout_documents(model_dir)
    return realistic_prompts(tokenizer, docs, workload["num_prompts"], workload["input_len"], workload["seed"])
