"""SGLang's rules for the speculative-decoding numbers, in one place for the study's config check, the embedded
server's flag parser and the engine itself (see SGLang's `ServerArgs._handle_speculative_decoding`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

NUMBER_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def as_flag(key: str) -> str:
    """`speculative_num_steps` -> `--speculative-num-steps`."""
    return "--" + key.replace("_", "-")


def speculation_problem(
    algorithm: str | None,
    numbers: Mapping[str, int | None],
    draft_path: object | None,
    name: Callable[[str], str] = as_flag,
) -> str | None:
    """The first rule the values break, naming keys through `name` (config keys or flags), or None.

    Steps, topk and draft tokens are set all together or not at all, none of them (nor a draft) without an
    algorithm, and with topk 1 the draft tokens must be steps + 1.
    """
    given = [key for key in NUMBER_KEYS if numbers.get(key) is not None]
    if algorithm is None:
        extra = given + (["speculative_draft_model_path"] if draft_path else [])
        return f"{name(extra[0])} is set but {name('speculative_algorithm')} is not" if extra else None
    if not given:
        return None
    if len(given) != len(NUMBER_KEYS):
        missing = ", ".join(name(key) for key in NUMBER_KEYS if key not in given)
        steps, topk, draft = (name(key) for key in NUMBER_KEYS)
        return f"set {steps}, {topk} and {draft} together or not at all (missing: {missing})"
    steps, topk, draft = (numbers[key] for key in NUMBER_KEYS)
    if topk == 1 and draft != steps + 1:
        return (
            f"{name(NUMBER_KEYS[2])} must be {name(NUMBER_KEYS[0])} + 1 = {steps + 1} "
            f"with {name(NUMBER_KEYS[1])} 1, got {draft}"
        )
    return None
