"""schemathesis hooks (SCHEMATHESIS_HOOKS=tests.server.schemathesis_hooks) for the fuzz test.

/openapi.json states every rule of one field, but JSON Schema cannot relate two fields, so two documented rules
stay prose: the prompt's tokens plus max_new_tokens must fit in the context length, and a batch's per-prompt
lists (sampling_params, rid) hold one entry per prompt. The server refuses a body that breaks them with a 400
naming the field, which is right, but schemathesis would count a schema-valid one as wrongly refused. So the
generated bodies that break them are dropped; every other body, valid or not, is sent. The token count is an
upper bound (byte-level BPE: at most one token per UTF-8 byte), so only bodies that might not fit are dropped.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

CONTEXT_LENGTH = int(os.environ.get("SPECSTUDY_FUZZ_CONTEXT_LENGTH", "0"))
DEFAULT_MAX_NEW = {"/generate": 128, "/v1/completions": 16, "/v1/chat/completions": None}


def _bytes(text: str) -> int:
    """UTF-8 bytes, lone surrogates included (JSON can carry them; the tokenizer replaces each by 3 bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _prompts(value: Any) -> list[int]:
    """Upper bounds of the token counts of a prompt field's prompts (a string, ids, or a batch of either)."""
    if isinstance(value, str):
        return [_bytes(value)]
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        return [_bytes(v) if isinstance(v, str) else len(v) for v in value]
    return [len(value)] if isinstance(value, list) else [0]


def _chat_prompt(messages: Any) -> int:
    rendered = 0
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        rendered += _bytes(f"<|im_start|>{message.get('role', '')}\n{content or ''}<|im_end|>\n")
    return rendered + len(b"<|im_start|>assistant\n")


def _fits(path: str, body: dict) -> bool:
    default = DEFAULT_MAX_NEW[path]
    if path == "/generate":
        prompts = _prompts(body.get("text") if body.get("input_ids") is None else body["input_ids"])
        sampling = body.get("sampling_params")
        per_prompt = sampling if isinstance(sampling, list) else [sampling or {}] * len(prompts)
        rids = body.get("rid")
        if len(per_prompt) != len(prompts) or (isinstance(rids, list) and len(rids) != len(prompts)):
            return False
        budgets = [(sp.get("max_new_tokens", default) if isinstance(sp, dict) else default) for sp in per_prompt]
    elif path == "/v1/completions":
        prompts = _prompts(body.get("prompt"))
        budgets = [body.get("max_tokens", default)] * len(prompts)
    else:
        prompts = [_chat_prompt(body.get("messages"))]
        newer = body.get("max_completion_tokens")  # wins over max_tokens unless null
        budgets = [newer if newer is not None else body.get("max_tokens", default)]
    return all(p + _number(b) < CONTEXT_LENGTH for p, b in zip(prompts, budgets))


def _number(value: Any) -> float:
    """A budget as the server reads it (63.0 is 63); anything else is refused on its own, so it counts 0."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@schemathesis.hook
def filter_case(context, case) -> bool:
    """(filter_case rather than filter_body: the coverage phase's boundary cases pass through it too)"""
    path, body = case.operation.path, case.body
    if path not in DEFAULT_MAX_NEW or not isinstance(body, dict):
        return True
    try:
        return _fits(path, body)
    except (TypeError, AttributeError, ValueError):  # a body malformed on purpose: send it
        return True
