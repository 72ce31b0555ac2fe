"""`/tapfix/metrics`: the aggregation (`aggregate.py`) in Prometheus' text format or OpenMetrics.

prometheus_client does no recording here, only the format: a custom collector turns each scrape's
snapshot into metric families, so names, labels, escaping and the OpenMetrics negotiation stay
prometheus_client's, and an exchange costs it nothing. The registry is one of its own (not
prometheus_client's global one, which would mix in the process collectors and whatever else imported it).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from tapfix.proxy.telemetry.aggregate import Aggregation
from tapfix.proxy.telemetry.metrics import label_values


class AggregationCollector(Collector):
    """The catalogue's families from one snapshot, in catalogue order, series in first-seen order."""

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation
        self.instruments = aggregation.catalogue.instruments
        # The `le` label of each histogram's buckets, formatted as prometheus_client's own Histogram does.
        self._le = {inst: [floatToGoString(b) for b in inst.buckets or ()] + ["+Inf"] for inst in self.instruments}  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        snapshot = self.aggregation.snapshot()
        for inst in self.instruments:
            names = [label.prometheus for label in inst.labels]
            common: dict[str, Any] = dict(labels=names, unit=inst.prometheus_unit)
            if inst.kind == "counter":
                counter = CounterMetricFamily(inst.prometheus_name, inst.description, **common)
                for key, value in snapshot.counters[inst].items():
                    counter.add_metric(label_values(key), value)
                yield counter
            elif inst.kind == "histogram":
                histogram = HistogramMetricFamily(inst.prometheus_name, inst.description, **common)
                for key, point in snapshot.histograms[inst].items():
                    cumulative, buckets = 0, []
                    for le, count in zip(self._le[inst], point.bucket_counts, strict=True):
                        cumulative += count
                        buckets.append((le, float(cumulative)))
                    histogram.add_metric(label_values(key), buckets, point.sum)
                yield histogram
            elif inst in snapshot.gauges:
                gauge = GaugeMetricFamily(inst.prometheus_name, inst.description, **common)
                gauge.add_metric([], snapshot.gauges[inst])
                yield gauge

    def describe(self) -> Iterator[Metric]:
        """The families without samples: the registry checks names for duplicates once, at register."""
        for inst in self.instruments:
            family = {"counter": CounterMetricFamily, "histogram": HistogramMetricFamily, "gauge": GaugeMetricFamily}
            yield family[inst.kind](inst.prometheus_name, inst.description, unit=inst.prometheus_unit)


class PrometheusExposition:
    """What `/tapfix/metrics` serves: a registry holding only the aggregation's collector."""

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation
        self.registry = CollectorRegistry()
        self.registry.register(AggregationCollector(aggregation))

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The text format (or OpenMetrics, when the scraper asks for it) and its content type."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def scrape(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        """A scrape's body and headers: the exposition, gzipped when the scraper accepts gzip (Prometheus
        always does: the text repeats every label on every bucket line and shrinks ~20 times)."""
        body, content_type = self.exposition(accept)
        headers = {"content-type": content_type, "vary": "accept-encoding"}
        if accepts_gzip(accept_encoding):
            body = gzip.compress(body, compresslevel=6)
            headers["content-encoding"] = "gzip"
        return body, headers


def accepts_gzip(accept_encoding: str | None) -> bool:
    """`gzip` (or `*`) listed in Accept-Encoding with a q-value above 0."""
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False
