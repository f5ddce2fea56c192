"""Prometheus `/metrics` with SGLang's metric names (`srt/metrics/collector.py`), for `--enable-metrics`.

Request counters and latency histograms are kept here, in the front, as SGLang's TokenizerMetricsCollector keeps
them. The scheduler's numbers are read from the engine process when /metrics is scraped: its gauges
(`num_running_reqs`, `num_queue_reqs`, and `gen_throughput`, `spec_accept_length`, `spec_accept_rate` over the
interval since the previous scrape, as SGLang's scheduler reports them over its last logging interval) and the
`spec_verify_calls_total` counter; and, under `specstudy:` names (SGLang has none), the wall time and the number of
the target's decode, extend (prefill-only) and mixed forwards, from which the cost model takes the share of a cell that
speculation cannot speed up, and their CPU time on the engine thread where that thread runs them alone (one torch
thread): the clock a time-sliced cell is read with.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from workflow_scripts.engine.types import FORWARD_MODES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# SGLang's default buckets (TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)


class _SchedulerCollector(Collector):
    """The engine's gauges and its verify counter, from the stats snapshot taken at the start of a scrape."""

    def __init__(self, labels: dict[str, str]):
        self._labels = labels
        self._stats: dict | None = None
        self._previous: tuple[float, dict] | None = None
        self._window = {"gen_throughput": 0.0, "spec_accept_length": 0.0, "spec_accept_rate": 0.0}

    def update(self, stats: dict) -> None:
        """Take a fresh snapshot; the interval gauges cover the time since the previous one."""
        now = time.monotonic()
        if self._previous is not None:
            then, old = self._previous
            d = {k: stats[k] - old[k] for k in ("total_generated_tokens", "total_verify_ct", "total_accepted_drafts",
                                               "total_proposed_drafts")}  # fmt: skip
            spec_tokens = _spec_tokens(stats) - _spec_tokens(old)
            self._window["gen_throughput"] = d["total_generated_tokens"] / (now - then) if now > then else 0.0
            if d["total_verify_ct"] > 0:  # SGLang keeps the last value through intervals without speculation
                self._window["spec_accept_length"] = spec_tokens / d["total_verify_ct"]
                if d["total_proposed_drafts"] > 0:
                    self._window["spec_accept_rate"] = d["total_accepted_drafts"] / d["total_proposed_drafts"]
        self._previous = (now, stats)
        self._stats = stats

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def collect(self) -> Iterator:
        if self._stats is None:
            return
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", self._stats["num_running"])
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
                          self._stats["num_waiting"])  # fmt: skip
        yield self._gauge("sglang:max_running_requests", "The maximum number of running requests.",
                          self._stats["max_running_requests"])  # fmt: skip
        yield self._gauge("sglang:gen_throughput", "The generation throughput (token/s).",
                          self._window["gen_throughput"])  # fmt: skip
        yield self._gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
                          self._window["spec_accept_length"])  # fmt: skip
        yield self._gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                          "(`accepted tokens / total draft tokens` in batch).", self._window["spec_accept_rate"])  # fmt: skip
        verify = CounterMetricFamily("sglang:spec_verify_calls", "Total number of speculative verify calls.",
                                     labels=list(self._labels))  # fmt: skip
        verify.add_metric(list(self._labels.values()), self._stats["total_verify_ct"])
        yield verify
        totals = [("seconds", "forward_seconds", "Wall time of the target's {} forwards (drafting and verifying "
                   "included)."), ("forwards", "forwards", "Number of {} forwards.")]
        if self._stats["forward_cpu_clock_whole"]:
            totals.append(("cpu_seconds", "forward_cpu_seconds", "CPU time of the engine thread in the target's {} "
                           "forwards: unlike the wall time, it stands still while the server is stopped or waits for "
                           "a core."))
        for mode in FORWARD_MODES:  # no SGLang name: the embedded engine's own (SGLang has no per-mode forward time)
            for what, name, doc in totals:
                family = CounterMetricFamily(f"specstudy:{mode}_{name}", doc.format(mode), labels=list(self._labels))
                family.add_metric(list(self._labels.values()), self._stats[f"total_{mode}_{what}"])
                yield family


def _spec_tokens(stats: dict) -> float:
    """Tokens committed by verify steps since start (accepted drafts plus one token per verify)."""
    return stats["avg_spec_accept_length"] * stats["total_verify_ct"]


class ServerMetrics:
    """The metrics of one server, in a registry of its own."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        names = list(self.labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=self.registry).labels(**self.labels)

        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
        self.requests = counter("sglang:num_requests_total", "Number of requests processed.")
        self.aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.")
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", names,
            registry=self.registry, buckets=TTFT_BUCKETS,
        ).labels(**self.labels)  # fmt: skip
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", names,
            registry=self.registry, buckets=E2E_BUCKETS,
        ).labels(**self.labels)  # fmt: skip
        self._scheduler = _SchedulerCollector(self.labels)
        self.registry.register(self._scheduler)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def finished(self, prompt_tokens: int, completion_tokens: int, e2e_s: float, aborted: bool) -> None:
        """One request ended (finished, aborted by the engine, or its client went away)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.requests.inc()
        self.e2e.observe(e2e_s)
        if aborted:
            self.aborted.inc()

    def render(self, engine_stats: dict) -> bytes:
        """The exposition text, with the scheduler's numbers as of `engine_stats`."""
        self._scheduler.update(engine_stats)
        return generate_latest(self.registry)
