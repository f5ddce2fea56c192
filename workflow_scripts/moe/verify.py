"""After a server starts: did it load the tuned MoE file we installed, or fall back silently?

SGLang (and the embedded engine, in the same words) logs `Using MoE kernel config from <path>.` when
it finds the file, a warning with `Fallback to triton version` when it takes another Triton's file, and
`Using default MoE kernel config` when it finds none. Only the first, naming our file, is a pass.
"""

from __future__ import annotations

import re
from pathlib import Path

_LOADED = re.compile(r"Using MoE kernel config from (?P<path>.+?\.json)\.?\s*$", re.MULTILINE)
_MISSING = re.compile(r"Config file not found at (?P<path>.+?\.json)")


class MoeConfigNotLoaded(RuntimeError):
    """The server did not load the tuned file; the message says what it did instead."""


def _same(a: str, b: Path) -> bool:
    return Path(a).resolve() == b.resolve()


def check_loaded(log_text: str, expected_file: Path) -> None:
    """Raise MoeConfigNotLoaded unless the log says the server loaded `expected_file` (and nothing else)."""
    expected_file = Path(expected_file)
    loaded = [m["path"] for m in _LOADED.finditer(log_text) if not m["path"].endswith("_down.json")]
    ours = [p for p in loaded if _same(p, expected_file)]
    others = sorted({p for p in loaded if not _same(p, expected_file)})
    if ours and not others:
        return
    if others:
        raise MoeConfigNotLoaded(f"server loaded MoE config {others} instead of the tuned {expected_file}")
    looked_for = sorted({m["path"] for m in _MISSING.finditer(log_text)})
    if looked_for:
        names = ", ".join(Path(p).name for p in looked_for)
        raise MoeConfigNotLoaded(
            f"server did not load the tuned {expected_file}: it looked for {looked_for} and fell back "
            f"(file name it wanted: {names}; installed: {expected_file.name})"
        )
    raise MoeConfigNotLoaded(
        f"server log has no 'Using MoE kernel config from' line; cannot confirm {expected_file} was loaded "
        "(was SGLANG_MOE_CONFIG_DIR passed, and did the server log at INFO level?)"
    )

