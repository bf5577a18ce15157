"""One unlabelled gauge sample: the building block of collectors that read state at scrape time."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """A gauge family holding one sample of ``value``."""
    return GaugeMetricFamily(name, documentation, value=value)
