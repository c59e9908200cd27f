"""The server's Prometheus metrics (prometheus-client), names prefixed `mlxserve_`: counters
and histograms fed from each finished request's record, gauges read when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mlxserve.telemetry.record import Metered, RequestRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created sample per series: noise for every dashboard
REQUEST_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TOKEN_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5)


class _PerModel(Collector):
    """A gauge (or a counter) labelled by model, read from `source` when scraped."""

    def __init__(
        self,
        name: str,
        doc: str,
        source: Callable[[], Iterable[tuple[str, float]]],
        family: type = GaugeMetricFamily,
    ):
        self._name, self._doc, self._source, self._family = name, doc, source, family

    def collect(self):
        family = self._family(self._name, self._doc, labels=["model"])
        for model, value in self._source():
            family.add_metric([model], value)
        yield family

    def describe(self):
        return []


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and more
        r = self.registry
        self.requests = Counter(
            "mlxserve_requests", "Requests answered.", ["model", "endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "mlxserve_prompt_tokens", "Prompt tokens of finished requests.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "mlxserve_generation_tokens", "Tokens generated.", ["model"], registry=r
        )
        self.cache_hit_tokens = Counter(
            "mlxserve_prompt_cache_hit_tokens",
            "Prompt tokens taken from the prompt cache instead of processed.",
            ["model"],
            registry=r,
        )
        self.key_usage = Counter(
            "mlxserve_key_usage",
            "What each API key used (by its name), by model and unit: requests, prompt, "
            "cached and completion tokens, audio seconds, images, embedding inputs.",
            ["key", "model", "unit"],
            registry=r,
        )
        self.ttft = Histogram(
            "mlxserve_time_to_first_token_seconds",
            "From the request's arrival to its first generated token.",
            ["model"],
            buckets=REQUEST_SECONDS,
            registry=r,
        )
        self.inter_token = Histogram(
            "mlxserve_inter_token_latency_seconds",
            "Between consecutive tokens of one sequence.",
            ["model"],
            buckets=TOKEN_SECONDS,
            registry=r,
        )
        self.e2e = Histogram(
            "mlxserve_e2e_request_latency_seconds",
            "From the request's arrival to its last byte.",
            ["model"],
            buckets=REQUEST_SECONDS,
            registry=r,
        )

    def watch(
        self,
        running: Callable[[], int],
        waiting: Callable[[], int],
        prompt_cache_bytes: Callable[[], int],
        model_bytes: Callable[[], Iterable[tuple[str, int]]],
        mlx_active_bytes: Callable[[], int],
        mlx_cache_bytes: Callable[[], int],
        speculation: Callable[[], Iterable[tuple[str, int, int, int, int]]] = list,
    ) -> None:
        """Gauges (and counters kept by the engine) read from the server's parts at scrape
        time; `speculation` gives (model, drafted tokens, accepted tokens, drafts
        verified, passes replayed)."""
        r = self.registry
        Gauge(
            "mlxserve_mlx_active_memory_bytes", "Memory in MLX arrays now.", registry=r
        ).set_function(mlx_active_bytes)
        Gauge(
            "mlxserve_mlx_cache_memory_bytes",
            "Freed memory MLX keeps for reuse (bounded by --cache-limit-gb).",
            registry=r,
        ).set_function(mlx_cache_bytes)
        Gauge("mlxserve_requests_running", "Sequences decoding.", registry=r).set_function(running)
        Gauge(
            "mlxserve_requests_waiting", "Sequences accepted, not yet decoding.", registry=r
        ).set_function(waiting)
        Gauge(
            "mlxserve_prompt_cache_bytes", "KV bytes held by the prompt cache.", registry=r
        ).set_function(prompt_cache_bytes)
        r.register(_PerModel("mlxserve_model_memory_bytes", "Weights in memory.", model_bytes))
        for column, (outcome, doc) in enumerate(
            (
                ("drafted_tokens", "Tokens drafted (from the context, a drafter or an MTP head)."),
                ("accepted_tokens", "Drafted tokens the model agreed with (no step of their own)."),
                ("verified_drafts", "Drafts verified (a sequence's draft in one pass)."),
                (
                    "replayed_passes",
                    "Verify passes run again for recurrent layers that keep no state per"
                    " position (a rejected draft; gated delta-net layers keep theirs).",
                ),
            ),
            start=1,
        ):
            r.register(
                _PerModel(
                    f"mlxserve_speculative_{outcome}",
                    doc,
                    _column(speculation, column),
                    CounterMetricFamily,
                )
            )

    def observe(self, record: RequestRecord, endpoint: str) -> None:
        """Count a finished request."""
        model = record.model or ""
        self.requests.labels(model, endpoint, str(record.status)).inc()
        if not record.generated:
            return
        self.e2e.labels(model).observe(record.elapsed)
        self.prompt_tokens.labels(model).inc(record.prompt_tokens)
        self.cache_hit_tokens.labels(model).inc(record.cached_tokens)
        self.generation_tokens.labels(model).inc(record.completion_tokens)
        if record.ttft is not None:
            self.ttft.labels(model).observe(record.ttft)

    def meter(self, key: str, model: str, cost: Metered) -> None:
        for unit in fields(Metered):
            if value := getattr(cost, unit.name):
                self.key_usage.labels(key, model, unit.name).inc(value)

    def observe_token_gap(self, model: str, seconds: float) -> None:
        self.inter_token.labels(model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _column(
    rows: Callable[[], Iterable[tuple[str, int, int, int, int]]], index: int
) -> Callable[[], list[tuple[str, float]]]:
    """(model, value) pairs of one column of `rows`, read when called."""
    return lambda: [(row[0], float(row[index])) for row in rows()]
