"""What operators see: Prometheus metrics, their HTTP endpoint, and structured logs.

- :mod:`~substrate_gpu.observability.metrics` — :class:`AgentMetrics`, every metric the
  agent exports, in an injected registry with bounded label values.
- :mod:`~substrate_gpu.observability.registry` — :class:`AgentRegistry`, the registry the
  agent exports (no ``_created`` series).
- :mod:`~substrate_gpu.observability.http` — :class:`MetricsServer`, the registry served on
  127.0.0.1 (classic text and OpenMetrics), and ``/healthz``/``/readyz`` beside it.
- :mod:`~substrate_gpu.observability.health` — what those probes report (named checks, 200
  or 503, a plain-text body); the agent's checks are :mod:`substrate_gpu.service.health`.
- :mod:`~substrate_gpu.observability.logging` — :func:`configure_logging` and
  :func:`bind_actor`: JSON lines (or a console on a TTY), stdlib logs in the same shape.

Only the logging names are re-exported here: every command of the CLI configures logging,
and loading prometheus-client and the lifecycle (which the metrics' labels come from) for
that would triple a one-shot command's start. The rest is imported from its module
(``from substrate_gpu.observability.metrics import AgentMetrics``).

``metrics/`` at the repository root holds the Prometheus scrape config, recording rules and
alerts that read these metrics; ``docs/observability.md`` documents all of them.
"""

from __future__ import annotations

from substrate_gpu.observability.logging import bind_actor, configure_logging

__all__ = ["bind_actor", "configure_logging"]
