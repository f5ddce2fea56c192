"""OpenAI `/v1/completions` responses built from SGLang-shaped outputs, as SGLang's `serving_completions.py` does.

Streaming sends text deltas (the native outputs are cumulative), `finish_reason` as the bare type
("stop" | "length" | "abort") with `matched_stop`, and, with `stream_options.include_usage`, a last chunk with
`choices: []` and the usage.
"""

from __future__ import annotations

import time


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _choice(index: int, text: str, meta: dict) -> dict:
    reason = meta["finish_reason"]
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": reason["type"] if reason else None,
        "matched_stop": reason.get("matched") if reason else None,
    }


class CompletionShaper:
    """Turns the native outputs of one /v1/completions request into OpenAI objects, tracking stream offsets."""

    def __init__(self, model: str):
        self.model = model
        self.created = int(time.time())
        self._sent_chars: dict[int, int] = {}
        self._tokens: dict[int, tuple[int, int]] = {}  # index -> (prompt, completion)
        self._last_id = ""

    def _envelope(self, rid: str, choices: list[dict], usage_info: dict | None = None) -> dict:
        out = {"id": rid, "object": "text_completion", "created": self.created, "model": self.model, "choices": choices}
        if usage_info is not None:
            out["usage"] = usage_info
        return out

    def response(self, results: list[dict]) -> dict:
        """The non-streaming response for the finished outputs of every prompt."""
        choices = [_choice(i, r["text"], r["meta_info"]) for i, r in enumerate(results)]
        prompt = sum(r["meta_info"]["prompt_tokens"] for r in results)
        completion = sum(r["meta_info"]["completion_tokens"] for r in results)
        return self._envelope(results[0]["meta_info"]["id"], choices, usage(prompt, completion))

    def chunk(self, output: dict) -> dict:
        """The stream chunk for one native output: the text added since this prompt's previous chunk."""
        index = output.get("index", 0)
        meta = output["meta_info"]
        offset = self._sent_chars.get(index, 0)
        self._sent_chars[index] = len(output["text"])
        self._tokens[index] = (meta["prompt_tokens"], meta["completion_tokens"])
        self._last_id = meta["id"]
        return self._envelope(meta["id"], [_choice(index, output["text"][offset:], meta)])

    def usage_chunk(self) -> dict:
        """The closing chunk that `stream_options.include_usage` asks for."""
        prompt = sum(p for p, _ in self._tokens.values())
        completion = sum(c for _, c in self._tokens.values())
        return self._envelope(self._last_id, [], usage(prompt, completion))
