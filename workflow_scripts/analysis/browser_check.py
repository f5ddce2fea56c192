"""Open a Snakemake report in headless Chromium and check from the live DOM that every chart drew.

    python -m workflow_scripts.analysis.browser_check results/S/report.html [--screenshots DIR]

The Snakemake report is a single-page React app: results are embedded as data URIs and only shown when their
eye button is clicked, so ``--dump-dom`` sees an empty shell. This drives the page over the Chrome DevTools
Protocol instead (a websocket on 127.0.0.1, via aiohttp): for each chart it calls the same ``app.setView(...)``
the eye button calls, then, in the rendered page,
- SVG results: the ``<img>`` must have decoded (naturalWidth > 0), and its SVG must hold drawn marks;
- HTML results (interactive altair): inside the iframe, vega-embed must have rendered an ``<svg>`` whose mark
  groups hold drawn elements (the JS is inlined, so this works offline).
A chart with no drawn mark fails the check. A ``.zip`` report is unpacked and its ``report.html`` opened.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  # keep data: iframes in the page's process so the DevTools session can reach their DOM
                  "--disable-features=IsolateOrigins,site-per-process", "--window-size=1400,1000",
                  "--remote-debugging-port=0", "--remote-allow-origins=*",
                  "--allow-file-access-from-files"]  # the .zip report loads its charts from data/raw/
CHART_MIMES = {"image/svg+xml": "img", "text/html": "html"}

# JS run in the page / in a chart's iframe. Marks = drawn elements inside vega's mark groups.
COUNT_MARKS_JS = """(root => {
  const svg = root.querySelector('svg');
  if (!svg) return -1;
  const marks = svg.querySelectorAll('g[class~="role-mark"] > path, g[class~="role-mark"] > line, '
    + 'g[class~="role-mark"] > rect, g[class~="role-mark"] > text, g[class~="role-mark"] > circle');
  return Array.from(marks).filter(m => (m.getAttribute('d') || m.textContent || m.getAttribute('x2')
    || m.getAttribute('width') || m.getAttribute('r'))).length;
})"""
IMG_STATE_JS = """(async (uri) => {
  const img = Array.from(document.querySelectorAll('#app img')).find(i => i.getAttribute('src') === uri);
  if (!img || !img.complete || img.naturalWidth === 0) return {ready: false};
  const text = await (await fetch(img.src)).text();
  const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
  return {ready: true, width: img.naturalWidth, height: img.naturalHeight,
          marks: %s(doc)};
})""" % COUNT_MARKS_JS


class BrowserCheckError(RuntimeError):
    """The report did not render its charts; the message says which and why."""


@dataclass
class ChartResult:
    path: str
    mime: str
    marks: int
    screenshot: str | None = None


class _CDP:
    """A minimal Chrome DevTools Protocol client over one websocket (commands and awaited events)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids = ws, itertools.count(1)
        self.events: list[dict] = []

    async def send(self, method: str, timeout: float = 30, **params: Any) -> dict:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = await self.ws.receive_json(timeout=max(deadline - time.monotonic(), 0.01))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserCheckError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise BrowserCheckError(f"{method}: no answer within {timeout} s")

    async def evaluate(self, expression: str, context_id: int | None = None) -> Any:
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        result = await self.send("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise BrowserCheckError(f"JS error: {result['exceptionDetails'].get('text')} in {expression[:80]!r}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str, context_id: int | None = None) -> Any:
        """Poll a JS expression until it is truthy (bounded in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression, context_id)
            if value and not (isinstance(value, dict) and value.get("ready") is False):
                return value
            await asyncio.sleep(0.2)
        raise BrowserCheckError(f"timed out after {timeout} s waiting for {what}")


def _find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise BrowserCheckError("no chromium on PATH; install Debian's package: apt-get install -y chromium")


async def _devtools_port(profile: Path, proc: subprocess.Popen, timeout: float) -> int:
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrowserCheckError(f"chromium exited with code {proc.returncode} before opening DevTools")
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text().split()[0])
        await asyncio.sleep(0.1)
    raise BrowserCheckError(f"chromium did not open DevTools within {timeout} s")


async def _check_chart(cdp: _CDP, path: str, mime: str, timeout: float) -> int:
    view = CHART_MIMES[mime]
    await cdp.evaluate(f"app.setView({{content: {json.dumps(view)}, contentPath: results[{json.dumps(path)}]"
                       f".data_uri, resultPath: {json.dumps(path)}}})")
    if view == "img":
        state = await cdp.wait_for(f"{IMG_STATE_JS}(results[{json.dumps(path)}].data_uri)", timeout,
                                   f"{path} to show as an image")
        return int(state["marks"])
    await cdp.wait_for("(() => { const f = document.querySelector('#app iframe'); "
                       "return !!f && f.getAttribute('src') && f.getAttribute('src').length > 0; })()",
                       timeout, f"{path} to show in an iframe")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tree = await cdp.send("Page.getFrameTree")
        for child in tree["frameTree"].get("childFrames", []):
            frame = child["frame"]
            if not frame.get("url", "").startswith("data:text/html") and "data/raw" not in frame.get("url", ""):
                continue
            world = await cdp.send("Page.createIsolatedWorld", frameId=frame["id"], worldName="check")
            marks = await cdp.evaluate(f"{COUNT_MARKS_JS}(document)", world["executionContextId"])
            if marks and marks > 0:
                return int(marks)
        await asyncio.sleep(0.3)
    raise BrowserCheckError(f"{path}: the interactive chart drew no marks within {timeout} s")


async def _run(report: Path, screenshots: Path | None, timeout: float) -> list[ChartResult]:
    profile = Path(tempfile.mkdtemp(prefix="browser-check-"))
    proc = subprocess.Popen([_find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port = await _devtools_port(profile, proc, timeout)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                pages = [t for t in await resp.json() if t.get("type") == "page"]
            if not pages:
                raise BrowserCheckError("chromium shows no page target")
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                cdp = _CDP(ws)
                await cdp.send("Page.enable")
                await cdp.send("Runtime.enable")
                await cdp.send("Page.navigate", url=report.resolve().as_uri())
                await cdp.wait_for("typeof app !== 'undefined' && typeof results !== 'undefined' && "
                                   "document.readyState === 'complete'", timeout, "the report app to load")
                entries = await cdp.evaluate(
                    "Object.entries(results).map(([k, v]) => [k, v.mime_type])")
                charts = [(k, m) for k, m in entries if m in CHART_MIMES and "/plots/" in f"/{k}"]
                if not charts:
                    raise BrowserCheckError(f"{report}: no chart (SVG or HTML under plots/) among "
                                            f"{len(entries)} report items")
                out = []
                for path, mime in charts:
                    marks = await _check_chart(cdp, path, mime, timeout)
                    shot = None
                    if screenshots is not None:
                        png = await cdp.send("Page.captureScreenshot", format="png")
                        target = screenshots / (path.replace("/", "_") + ".png")
                        target.write_bytes(base64.b64decode(png["data"]))
                        shot = str(target)
                    out.append(ChartResult(path, mime, marks, shot))
                return out
    finally:
        _stop(proc)
        shutil.rmtree(profile, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """End chromium and its helper processes (its own process group, started above)."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def check_report(report: Path | str, screenshots: Path | str | None = None,
                 timeout: float = 60.0) -> list[ChartResult]:
    """Render the report (``.html`` or ``.zip``) and return each chart's drawn-mark count; raise if any is 0."""
    report = Path(report)
    if not report.exists():
        raise BrowserCheckError(f"{report}: no such report")
    shots = Path(screenshots) if screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="report-zip-") as unpacked:
        if report.suffix == ".zip":
            with zipfile.ZipFile(report) as archive:
                archive.extractall(unpacked)
            found = sorted(Path(unpacked).glob("*/report.html")) + sorted(Path(unpacked).glob("report.html"))
            if not found:
                raise BrowserCheckError(f"{report}: no report.html inside the archive")
            report = found[0]
        results = asyncio.run(_run(report, shots, timeout))
    empty = [r.path for r in results if r.marks <= 0]
    if empty:
        raise BrowserCheckError(f"charts drew nothing: {', '.join(empty)}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="report.html or report.zip from `snakemake --report`")
    parser.add_argument("--screenshots", type=Path, help="save a PNG of the page for each chart here")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step")
    args = parser.parse_args(argv)
    try:
        results = check_report(args.report, args.screenshots, args.timeout)
    except BrowserCheckError as exc:
        print(f"browser check FAILED: {exc}", file=sys.stderr)
        return 1
    for r in results:
        print(f"ok  {r.marks:5d} marks  {r.mime:14s} {r.path}")
    print(f"browser check passed: {len(results)} charts drew")
    return 0


if __name__ == "__main__":
    sys.exit(main())
