"""The summary's line on what the HTTP server costs the engine (profile/served_overhead.json, written at the start
of an embedded study by workflow_scripts/profiling/served_overhead.py).

Every cell of the study is measured through the server; where the served engine runs well below its in-process
speed, a setting's gain is diluted by the server's share of each step, so the line warns and says why. A study
without the file (an SGLang study, or external tables only) gets no line.
"""

from __future__ import annotations

import json
from pathlib import Path


def server_cost_lines(path: Path) -> list[str]:
    """One paragraph (or none) for "How it was measured"; names the file when it cannot be read."""
    if not path.is_file():
        return []
    try:
        check = json.loads(path.read_text())
        ratio, warn_below = float(check["ratio"]), float(check["warn_below"])
        served, in_process = float(check["served_tok_s"]), float(check["in_process_tok_s"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a served-overhead result ({err!r})") from None
    threads = (check.get("engine_torch") or {}).get("num_threads", "?")
    line = (f"Server cost: the baseline's decode through the HTTP server ran at {ratio:.2f} of the same engine "
            f"in-process at concurrency 1 ({served:.0f} vs {in_process:.0f} tok/s, median of {check['rounds']} "
            f"alternating rounds at the start of the run; engine process on {threads} torch thread(s)).")
    if ratio < warn_below:
        line += (f" **⚠ below {warn_below:.2f}: the server's own cost is a large share of every cell here, so the "
                 "study's verdicts say more about the server than about speculation** "
                 "(docs/embedded_engine_served.md).")
    return [line, ""]
