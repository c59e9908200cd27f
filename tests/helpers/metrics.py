"""The server's Prometheus metrics, parsed."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metrics(srv) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}."""
    status, headers, text = srv.get("/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
