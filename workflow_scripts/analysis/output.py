"""Result tables as CSV (written atomically, see workflow_scripts.io) and as self-contained HTML pages."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.io import atomic_write_text

TABLE_CSS = """<style>
body{font-family:system-ui,sans-serif;margin:1rem;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0}
tr:nth-child(even) td{background:#fafafa}
caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
</style>"""


def write_csv(frame: pd.DataFrame, path: Path | str) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def _fmt(x: object) -> str:
    if isinstance(x, (float, np.floating)):
        return "—" if not np.isfinite(x) else f"{x:,.2f}"
    return "—" if x is None or x is pd.NA else str(x)


def html_page(title: str, sections: list[tuple[str, pd.DataFrame]], intro: str = "") -> str:
    """A self-contained HTML page with one table per section; NaN shows as — (no data), never 0."""
    title = html.escape(title)
    body = [f"<h2>{title}</h2>", f"<p>{html.escape(intro)}</p>" if intro else ""]
    for caption, frame in sections:
        table = frame.map(_fmt).to_html(index=False, escape=True, border=0)
        body.append(f"<h3>{html.escape(caption)}</h3>{table}" if caption else table)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>{TABLE_CSS}</head>"
            f"<body>{''.join(body)}</body></html>")
