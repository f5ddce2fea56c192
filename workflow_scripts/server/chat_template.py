"""The served model's chat template (tokenizer_config.json `chat_template`), rendered as transformers renders it.

transformers' `apply_chat_template` (what SGLang calls for /v1/chat/completions) compiles the Jinja template in a
sandbox with `trim_blocks` and `lstrip_blocks`, and gives it `raise_exception`; the same here, without importing
transformers into the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (its `raise_exception`) or failed to render it."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def load_chat_template(tokenizer_dir: Path) -> Callable[[list[dict]], str] | None:
    """A function rendering messages (with the generation prompt) to the prompt text, or None without a template.

    A template that does not compile fails here, at start-up, naming the file.
    """
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    source = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    if not source:
        return None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        template = env.from_string(source)
    except TemplateError as err:
        raise ValueError(f"{path}: chat_template does not compile: {err}") from None

    def render(messages: list[dict]) -> str:
        try:
            return template.render(messages=messages, add_generation_prompt=True)
        except TemplateError as err:
            raise ChatTemplateError(f"the chat template failed: {err}") from None

    return render
