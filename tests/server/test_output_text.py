"""Incremental detokenization on the real byte-level BPE: partial characters held back, stop strings per token."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from workflow_scripts.server.server_text import OutputText


@pytest.fixture(scope="module")
def tokenizer(tiny_models) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_models["target"] / "tokenizer.json"))


def _decoder(tokenizer: Tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def test_partial_utf8_is_held_back_until_complete(tokenizer):
    text = "naïve 😀 done"
    ids = tokenizer.encode(text).ids
    assert len(ids) > len(text.split()), "the emoji should span several byte tokens"
    out = OutputText(_decoder(tokenizer))
    shown = []
    for token in ids:
        assert out.extend([token]) is None
        shown.append(out.text(finished=False))
    assert all("\ufffd" not in s for s in shown)
    assert all(b.startswith(a) for a, b in zip(shown, shown[1:]))
    assert out.text(finished=True) == text


def test_stop_string_across_tokens_in_one_step(tokenizer):
    text = "return value # end of it"
    ids = tokenizer.encode(text).ids
    out = OutputText(_decoder(tokenizer), stop_strs=("# end",))
    assert out.extend(ids) == "# end"  # all ids in one speculative step: later ids are dropped
    assert out.text(finished=True) == "return value "
    assert "# end" in tokenizer.decode(out.output_ids)
    assert "# end" not in tokenizer.decode(out.output_ids[:-1])
    assert out.extend([ids[0]]) == "# end" and len(out.output_ids) < len(ids)


def test_no_stop_trim_keeps_the_earliest_stop(tokenizer):
    ids = tokenizer.encode("a = 1\nb = 2\n").ids
    out = OutputText(_decoder(tokenizer), stop_strs=("b =", "\n"), no_stop_trim=True)
    assert out.extend(ids) == "\n"
    assert out.text(finished=True) == "a = 1\n"


def test_a_possible_stop_string_is_held_back_so_the_text_only_grows(tokenizer):
    text = "x = 1 # en d # end more"
    ids = tokenizer.encode(text).ids
    out = OutputText(_decoder(tokenizer), stop_strs=("# end",))
    shown = []
    for token in ids:
        if out.extend([token]) is not None:
            break
        shown.append(out.text(finished=False))
    final = out.text(finished=True)
    assert final == "x = 1 # en d "
    assert all(b.startswith(a) for a, b in zip([*shown, final], [*shown[1:], final]))
    assert any(s.endswith("# en d ") for s in shown), "a tail that stopped matching is shown again"
