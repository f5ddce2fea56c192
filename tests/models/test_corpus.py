"""The corpus: one definition per document, EOS after each, and a file-level held-out split."""

from __future__ import annotations

import json
import textwrap

from tokenizers import Tokenizer

from workflow_scripts.models import corpus
from workflow_scripts.models.architecture import EOS_ID
from workflow_scripts.models.tokenizer import EOS_TOKEN
from workflow_scripts.models.training import token_stream


def test_definitions_keep_decorators_skip_long_ones_and_split_big_classes():
    body = "\n".join(f"    x{i} = {i} * value  # padding line" for i in range(40))
    source = textwrap.dedent('''
        import functools

        @functools.cache
        def small(value):
            """Return a value that needs some words to pass the minimum length of a document."""
            return value * 2 + 1
        ''') + f"\ndef too_long(value):\n{body}\n    return value\n\n" + "class Big:\n" + textwrap.indent(
        f"def method(self, value):\n    '''A method long enough to be a document on its own, with quite a few words in it.'''\n"
        f"    return value + 1\n\ndef other(self, value):\n{body}\n    return value\n", "    ")
    docs = corpus.top_level_definitions(source)
    assert docs[0].startswith("@functools.cache\ndef small(value):")
    assert not any("too_long" in d for d in docs)
    assert docs[1].startswith("def method(self, value):")  # dedented method of an over-cap class
    assert len(docs) == 2


def test_split_is_by_file_disjoint_and_deterministic():
    first, second = corpus.build_corpus(max_files=60), corpus.build_corpus(max_files=60)
    assert first == second
    assert set(first.train_files).isdisjoint(first.val_files)
    assert all(corpus.is_validation_file(f) for f in first.val_files)
    assert not any(corpus.is_validation_file(f) for f in first.train_files)
    for f in first.train_files + first.val_files:
        assert corpus.is_library_file(f) and "test" not in f.split("/")[:-1] and "idlelib" not in f


def test_heldout_documents_are_the_full_corpus_validation_docs():
    docs = corpus.heldout_documents()
    full = corpus.build_corpus()
    assert docs == full.val_docs and len(docs) > 100
    assert all(corpus.MIN_CHARS <= len(d) <= corpus.MAX_CHARS and EOS_TOKEN not in d for d in docs)


def test_training_stream_ends_every_document_with_eos(smoke_pair):
    target_dir, _ = smoke_pair
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    assert tok.encode(EOS_TOKEN).ids == [EOS_ID]
    docs = [json.loads(line)["text"] for line in (target_dir / "heldout.jsonl").read_text().splitlines()[:20]]
    stream = token_stream(tok, docs, EOS_ID, seed=0)
    assert (stream == EOS_ID).sum().item() == len(docs)
    assert stream[-1].item() == EOS_ID
    decoded = tok.decode(stream.tolist(), skip_special_tokens=False)
    assert sorted(decoded.split(EOS_TOKEN)[:-1]) == sorted(docs)  # each doc intact, then EOS
