"""`GET /metrics`: Prometheus text from the server's own registry (prometheus-client).

Requests by endpoint and status, prompt and generation tokens, time to first token, inter-token latency and
request latency histograms, and the engine's state read at scrape time from `LLM.stats()` (every field of
`EngineStats`: requests running and waiting, KV blocks in use, and whatever else the engine reports)."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5.0, 10.0, 20.0, 60.0)

_STATS = {
    "running": ("kernelbay_requests_running", "Requests in the engine's running batch"),
    "waiting": ("kernelbay_requests_waiting", "Requests queued for the running batch"),
    "kv_blocks_used": ("kernelbay_kv_blocks_used", "KV-cache blocks held by requests"),
    "kv_blocks_total": ("kernelbay_kv_blocks_capacity", "KV-cache blocks in the whole cache"),
}
"""EngineStats fields -> metric name and help; any other field is exported as kernelbay_<field>."""


class _EngineCollector:
    """Reads the engine's state when /metrics is scraped (nothing is polled in between)."""

    def __init__(self, llm, in_flight):
        self.llm, self.in_flight = llm, in_flight

    def collect(self):
        stats = self.llm.stats()
        for field in dataclasses.fields(stats):
            name, text = _STATS.get(field.name, (f"kernelbay_{field.name}", f"EngineStats.{field.name}"))
            yield GaugeMetricFamily(name, text, value=getattr(stats, field.name))
        yield GaugeMetricFamily(
            "kernelbay_sequences_admitted",
            "Sequences admitted by the HTTP server (running or queued)",
            self.in_flight(),
        )


class ServeMetrics:
    """The counters and histograms a server updates as it answers requests."""

    def __init__(self, llm, in_flight):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kernelbay_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter("kernelbay_prompt_tokens", "Prompt tokens admitted", registry=self.registry)
        self.generation_tokens = Counter("kernelbay_generation_tokens", "Tokens generated", registry=self.registry)
        self.time_to_first_token = Histogram(
            "kernelbay_time_to_first_token_seconds",
            "Seconds from admission to a sequence's first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inter_token_latency = Histogram(
            "kernelbay_inter_token_latency_seconds",
            "Seconds between consecutive tokens of a sequence",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "kernelbay_e2e_request_latency_seconds",
            "Seconds from admission to a request's last token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(llm, in_flight))
