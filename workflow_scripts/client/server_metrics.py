"""The server's own Prometheus metrics around a cell, as `vllm bench sweep` records vLLM's: scrape /metrics before
and after, keep the per-cell deltas beside the client's per-request numbers.

Works against SGLang (`--enable-metrics`) and the embedded engine alike (same `sglang:*` names):

    before = await scrape(session, base_url)
    ...run the cell...
    after = await scrape(session, base_url)
    row.update(cell_deltas(before, after))   # e.g. {"sglang:generation_tokens_total": 4096.0,
                                             #       "sglang:time_to_first_token_seconds_count": 64.0,
                                             #       "sglang:spec_accept_length": 2.7, ...}

A scrape is a flat dict of floats keyed by sample name. Counters (`*_total`) and histogram `*_count` / `*_sum`
are summed over their label sets (e.g. SGLang's data-parallel ranks); gauges are averaged over them; histogram
buckets and `*_created` timestamps are left out.
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

CUMULATIVE_SUFFIXES = ("_total", "_count", "_sum")


class MetricsUnavailable(RuntimeError):
    """The server has no /metrics (started without --enable-metrics) or refused the scrape."""


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten a Prometheus exposition text into {sample name: value} (see the module docstring)."""
    sums: dict[str, float] = {}
    gauges: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith(("_bucket", "_created")):
                continue
            if family.type == "gauge":
                gauges.setdefault(name, []).append(sample.value)
            elif family.type in ("counter", "histogram", "summary") and name.endswith(CUMULATIVE_SUFFIXES):
                sums[name] = sums.get(name, 0.0) + sample.value
    return {**sums, **{name: sum(values) / len(values) for name, values in gauges.items()}}


async def scrape(session: aiohttp.ClientSession, base_url: str, api_key: str | None = None) -> dict[str, float]:
    """GET {base_url}/metrics and flatten it; raises MetricsUnavailable naming the URL and the status."""
    url = base_url.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with session.get(url, headers=headers) as resp:
        if resp.status != 200:
            raise MetricsUnavailable(f"{url} answered HTTP {resp.status} (is the server started with --enable-metrics?)")
        return parse_metrics(await resp.text())


def cell_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-cell values: counters and histogram count/sum as after - before, gauges as their value after the cell.

    A counter first seen after the cell (created by the cell's first request) counts from 0."""
    return {
        name: value - before.get(name, 0.0) if name.endswith(CUMULATIVE_SUFFIXES) else value
        for name, value in after.items()
    }
