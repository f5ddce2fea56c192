"""OpenAI `/v1/completions` and `/v1/chat/completions` responses built from SGLang-shaped outputs, as SGLang's
`serving_completions.py` and `serving_chat.py` do.

Streaming sends text deltas (the native outputs are cumulative), `finish_reason` as the bare type
("stop" | "length" | "abort") with `matched_stop`, and, with `stream_options.include_usage`, a last chunk with
`choices: []` and the usage. A chat stream opens each choice with a `{"role": "assistant"}` delta.
"""

from __future__ import annotations

import time


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _finish(meta: dict) -> dict:
    reason = meta["finish_reason"]
    return {"finish_reason": reason["type"] if reason else None, "matched_stop": reason.get("matched") if reason else None}


class CompletionShaper:
    """Turns the native outputs of one /v1/completions request into OpenAI objects, tracking stream offsets."""

    OBJECT, CHUNK_OBJECT = "text_completion", "text_completion"

    def __init__(self, model: str):
        self.model = model
        self.created = int(time.time())
        self._sent_chars: dict[int, int] = {}
        self._tokens: dict[int, tuple[int, int]] = {}  # index -> (prompt, completion)
        self._last_id = ""

    def _envelope(self, rid: str, obj: str, choices: list[dict], usage_info: dict | None = None) -> dict:
        out = {"id": rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage_info is not None:
            out["usage"] = usage_info
        return out

    def _choice(self, index: int, text: str, meta: dict) -> dict:
        return {"index": index, "text": text, "logprobs": None, **_finish(meta)}

    def _delta_choices(self, index: int, delta: str, meta: dict) -> list[dict]:
        return [self._choice(index, delta, meta)]

    def response(self, results: list[dict]) -> dict:
        """The non-streaming response for the finished outputs of every prompt."""
        choices = [self._choice(i, r["text"], r["meta_info"]) for i, r in enumerate(results)]
        prompt = sum(r["meta_info"]["prompt_tokens"] for r in results)
        completion = sum(r["meta_info"]["completion_tokens"] for r in results)
        return self._envelope(results[0]["meta_info"]["id"], self.OBJECT, choices, usage(prompt, completion))

    def chunks(self, output: dict) -> list[dict]:
        """The stream chunks for one native output: the text added since this prompt's previous chunk."""
        index = output.get("index", 0)
        meta = output["meta_info"]
        offset = self._sent_chars.get(index)
        self._sent_chars[index] = len(output["text"])
        self._tokens[index] = (meta["prompt_tokens"], meta["completion_tokens"])
        self._last_id = meta["id"]
        choices = self._delta_choices(index, output["text"][offset or 0:], meta)
        if offset is None:
            choices = self._opening(index) + choices
        return [self._envelope(meta["id"], self.CHUNK_OBJECT, [choice]) for choice in choices]

    def _opening(self, index: int) -> list[dict]:
        """Choices sent before a prompt's first text (none for completions)."""
        return []

    def usage_chunk(self) -> dict:
        """The closing chunk that `stream_options.include_usage` asks for."""
        prompt = sum(p for p, _ in self._tokens.values())
        completion = sum(c for _, c in self._tokens.values())
        return self._envelope(self._last_id, self.CHUNK_OBJECT, [], usage(prompt, completion))


class ChatShaper(CompletionShaper):
    """The same for one /v1/chat/completions request: an assistant `message`, or `delta`s when streamed."""

    OBJECT, CHUNK_OBJECT = "chat.completion", "chat.completion.chunk"

    def _choice(self, index: int, text: str, meta: dict) -> dict:
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        return {"index": index, "message": message, "logprobs": None, **_finish(meta)}

    def _delta_choices(self, index: int, delta: str, meta: dict) -> list[dict]:
        return [{"index": index, "delta": {"content": delta}, "logprobs": None, **_finish(meta)}]

    def _opening(self, index: int) -> list[dict]:
        return [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None, "matched_stop": None}]
