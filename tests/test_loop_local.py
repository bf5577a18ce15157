"""The loop-local counters and histograms scrape as prometheus_client's own would: the same text
for the same observations, so dashboards and alerts cannot tell them apart."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as library
from prometheus_client.parser import text_string_to_metric_families

from sidecar.telemetry.loop_local import LoopCollector, LoopCounter, LoopHistogram
from sidecar.telemetry.metrics import WAIT_BUCKETS, RequestMetrics

BUCKETS = (0.001, 0.01, 0.5, 1.0, 10.0)
# Below, on and between the bounds, past the last one, and the odd ones a clock can give.
AMOUNTS = (0.0, 0.001, 0.0010001, 0.01, 0.3, 0.5, 1.0, 9.99, 10.0, 10.01, 1e9, -0.5)
CREATED = re.compile(r"(_created(?:\{[^}]*\})?) \S+")


def _pair() -> tuple[CollectorRegistry, Counter, Histogram, CollectorRegistry, LoopCounter,
                     LoopHistogram]:  # fmt: skip
    theirs = CollectorRegistry()
    counter = Counter("t_requests", "Requests.", ["outcome"], registry=theirs)
    histogram = Histogram("t_wait_seconds", "Waits.", buckets=BUCKETS, registry=theirs)
    ours = CollectorRegistry()
    loop_counter = LoopCounter("t_requests", "Requests.", "outcome")
    loop_histogram = LoopHistogram("t_wait_seconds", "Waits.", BUCKETS)
    ours.register(LoopCollector((loop_counter, loop_histogram)))
    return theirs, counter, histogram, ours, loop_counter, loop_histogram


def _text(registry: CollectorRegistry) -> str:
    """The scrape, creation times masked (they are when each series was made)."""
    return CREATED.sub(r"\1 T", generate_latest(registry).decode())


def test_the_same_observations_scrape_as_the_librarys_text() -> None:
    theirs, counter, histogram, ours, loop_counter, loop_histogram = _pair()
    assert _text(ours) == _text(theirs)  # empty: HELP and TYPE, the histogram's zero buckets
    for i, amount in enumerate(AMOUNTS):
        outcome = ("completed", "timeout", "queue_full")[i % 3]
        counter.labels(outcome).inc()
        loop_counter.inc(outcome)
        histogram.observe(amount)
        loop_histogram.observe(amount)
    assert _text(ours) == _text(theirs)
    assert loop_histogram.count == len(AMOUNTS)
    assert loop_counter.get("completed") == 4
    assert loop_counter.get("never") == 0


def test_an_observation_on_a_bound_lands_in_that_bound() -> None:
    """``le`` is "less than or equal": 1.0 counts in le="1.0", not only in the next one."""
    *_, ours, _counter, histogram = _pair()
    histogram.observe(1.0)
    samples = {
        sample.labels["le"]: sample.value
        for family in text_string_to_metric_families(generate_latest(ours).decode())
        for sample in family.samples
        if sample.name == "t_wait_seconds_bucket"
    }
    assert (samples["0.5"], samples["1.0"], samples["+Inf"]) == (0.0, 1.0, 1.0)


def test_created_series_follow_the_librarys_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROMETHEUS_DISABLE_CREATED_SERIES (or ``disable_created_metrics()``) drops ``_created``
    from ours as from the library's."""
    theirs, counter, _histogram, ours, loop_counter, _loop_histogram = _pair()
    counter.labels("completed").inc()
    loop_counter.inc("completed")
    assert "_created" in _text(ours)
    monkeypatch.setattr(library, "_use_created", False)
    assert "_created" not in _text(ours)
    assert _text(ours) == _text(theirs)


def test_seeded_values_are_exported_at_zero_from_the_start() -> None:
    registry = CollectorRegistry()
    registry.register(LoopCollector([LoopCounter("t_ends", "Ends.", "how", seed=("a", "b"))]))
    text = generate_latest(registry).decode()
    assert 't_ends_total{how="a"} 0.0' in text
    assert 't_ends_total{how="b"} 0.0' in text


@pytest.mark.parametrize("buckets", [(1.0, 0.5), (0.5, 0.5)], ids=["unsorted", "repeated"])
def test_buckets_must_be_distinct_and_increasing(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="increasing"):
        LoopHistogram("t_bad", "Bad.", buckets)


def test_request_metrics_count_what_the_proxy_reports() -> None:
    """The proxy's three calls, read back through a scrape as Prometheus would parse it."""
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    metrics.finished("completed", 0.3)
    metrics.finished("timeout", 3.0)
    metrics.waited(0.002)
    metrics.shadow_rejected("queue_full")
    got = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    assert got[("sidecar_requests_total", (("outcome", "completed"),))] == 1.0
    assert got[("sidecar_requests_total", (("outcome", "timeout"),))] == 1.0
    assert got[("sidecar_request_duration_seconds_count", ())] == 2.0
    assert got[("sidecar_request_duration_seconds_sum", ())] == pytest.approx(3.3)
    assert got[("sidecar_queue_wait_seconds_bucket", (("le", "0.005"),))] == 1.0
    assert got[("sidecar_queue_wait_seconds_bucket", (("le", "0.001"),))] == 0.0
    assert got[("sidecar_shadow_rejections_total", (("reason", "queue_full"),))] == 1.0
    assert len(WAIT_BUCKETS) + 1 == sum(
        1 for name, _ in got if name == "sidecar_queue_wait_seconds_bucket"
    )
