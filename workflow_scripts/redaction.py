"""Keep secrets out of what the study publishes: values under `server.env` (an SGLang run may pass a token there).

The metadata JSON/HTML and the Snakemake report (each result's job params) show the config; they get a copy with
those values replaced by REDACTED (the keys stay, so a reader still sees which variables were set). Snakemake 9's
HTML report does not render the config files themselves.
"""

from __future__ import annotations

import copy
from typing import Any

REDACTED = "<redacted>"


def _env(config: dict[str, Any]) -> dict[str, Any] | None:
    server = config.get("server")
    env = server.get("env") if isinstance(server, dict) else None
    return env if isinstance(env, dict) and env else None


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `config` with every `server.env` value replaced by REDACTED."""
    out = copy.deepcopy(config)
    env = _env(out)
    if env is not None:
        out["server"]["env"] = {key: REDACTED for key in env}
    return out
