"""A registry rendered as prometheus_client's multiprocess collector renders it, which is how SGLang serves
/metrics (its processes share one multiprocess directory): no ``_created`` series, label names sorted, and no
family that has no series yet (a counter nobody incremented is absent, not zero)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class MultiprocessView(Collector):
    """``source``'s families as the multiprocess collector shows them."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def describe(self) -> Iterable[Metric]:
        """Every family, with or without series, so a scrape may ask for some by name (``name[]``)."""
        for family in self.source.collect():
            yield Metric(family.name, family.documentation, family.type, family.unit)

    def collect(self) -> Iterable[Metric]:
        for family in self.source.collect():
            samples = [s._replace(labels=dict(sorted(s.labels.items()))) for s in family.samples
                       if not s.name.endswith("_created")]
            if not samples:
                continue
            view = Metric(family.name, family.documentation, family.type, family.unit)
            view.samples = samples
            yield view


def exposition_registry(source: CollectorRegistry) -> CollectorRegistry:
    """A registry to render /metrics from: ``source`` through ``MultiprocessView``."""
    registry = CollectorRegistry()
    registry.register(MultiprocessView(source))
    return registry
