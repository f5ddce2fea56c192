"""The shared byte-level BPE tokenizer of the pair (one vocabulary for target and draft).

Byte-level so any prompt text encodes (no unknown tokens); EOS ends every document so the models
learn to stop, and a pad token lets batched clients pad.

Chat follows Qwen's base models: a ChatML template in tokenizer_config.json, whose `<|im_start|>` and `<|im_end|>`
are special tokens (one id each, dropped by `skip_special_tokens`, never merged with the text around them), while
EOS stays `<|endoftext|>`. They are trainer specials, so the ids are fixed (2 and 3) and the build deterministic;
the stdlib corpus never contains them, so the model does not learn them: chat works, it does not make the model
conversational.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN, IM_START, IM_END]  # ids 0..3

# ChatML as in Qwen2.5/Qwen3 base models' tokenizer_config.json, without tools or thinking: each message is
# `<|im_start|>{role}\n{content}<|im_end|>\n`; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def train_tokenizer(docs: list[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on `docs` (deterministic for the same docs and vocab size)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # A newline is always its own token: a prompt that ends at a line break (a definition's head) then
    # ends on a token the model saw inside every document, not on the lone "\n" that the plain
    # byte-level split produces only at a document's end, right before EOS.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def as_transformers(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap for `save_pretrained`, so `AutoTokenizer.from_pretrained(dir)` (and SGLang) load it."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   model_max_length=2048, clean_up_tokenization_spaces=False)


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json into `out_dir`.

    The class is recorded as PreTrainedTokenizerFast, not transformers 5's "TokenizersBackend", so that
    SGLang installs with transformers 4.x load it too (transformers 5 maps the old name to the new class).
    The chat template goes into tokenizer_config.json, where every transformers version (and so SGLang) reads it.
    """
    as_transformers(tok).save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
