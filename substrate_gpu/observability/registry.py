"""The agent's metrics registry: prometheus-client's, without the ``_created`` series.

prometheus-client gives every counter and histogram series a ``<name>_created`` sample (the
time the series was born, for OpenMetrics consumers that detect resets that way). The agent
creates most series up front at start (see ``docs/observability.md``), so nearly all of
those timestamps say "when the agent started"; no rule, alert or dashboard here reads them,
and they were 189 of 1,093 lines of a scrape. The library can
only switch them off process-wide (``disable_created_metrics()``, or
``PROMETHEUS_DISABLE_CREATED_SERIES``), which would change an embedder's own registries too;
:class:`AgentRegistry` drops them from its own collection instead, whatever the format.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

__all__ = ["AgentRegistry"]


class AgentRegistry(CollectorRegistry):
    """A :class:`~prometheus_client.CollectorRegistry` whose collection has no ``_created``
    samples; use it as any registry (``AgentMetrics(AgentRegistry())``)."""

    def collect(self) -> Iterable[Metric]:
        """Every collector's metrics, ``<name>_created`` samples left out."""
        for metric in super().collect():
            created = f"{metric.name}_created"
            if not any(sample.name == created for sample in metric.samples):
                yield metric
                continue
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if s.name != created]
            yield kept
