"""A real Prometheus scrapes a MetricsServer with the project's config and rules.

The project's ``metrics/prometheus.yml`` is rendered with the test's target and a 1 s
scrape/evaluation interval; everything else (job name, rule files) is used as written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from substrate_gpu.observability.http import MetricsServer
from substrate_gpu.observability.metrics import AgentMetrics

from .prometheus_server import PrometheusAPI, running_prometheus
from .test_compose import _dashboard_exprs


@pytest.fixture(scope="module")
def agent_metrics() -> Iterator[tuple[MetricsServer, AgentMetrics]]:
    registry = CollectorRegistry()
    m = AgentMetrics(
        registry, actor_states=lambda: {"running": 3, "checkpointing": 1, "suspended": 2}
    )
    m.transition("running", "probing", "suspend_requested", actor_id="actor-1")
    m.checkpoint_refused("live_cuda_context", actor_id="actor-1")
    m.effect_finished("inject_gpu", "ok", 0.004, actor_id="actor-1")
    with MetricsServer(registry, port=0) as server:
        yield server, m


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str,
    agent_metrics: tuple[MetricsServer, AgentMetrics],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PrometheusAPI]:
    server, _ = agent_metrics
    with running_prometheus(
        prometheus_binary,
        f"127.0.0.1:{server.port}",
        tmp_path_factory.mktemp("prometheus"),
        extra_args=("--enable-feature=exemplar-storage",),
    ) as api:
        yield api


def test_real_prometheus_scrapes_rules_and_exemplars(
    prometheus: PrometheusAPI, agent_metrics: tuple[MetricsServer, AgentMetrics]
) -> None:
    """Series, recorded rules and actor exemplars all reach a real Prometheus."""
    (running,) = prometheus.wait_for('substrate_gpu_actors{state="running"}')
    assert running["value"][1] == "3"
    assert running["metric"]["job"] == "substrate-gpu-agent"
    (up,) = prometheus.query('up{job="substrate-gpu-agent"}')
    assert up["value"][1] == "1"

    # The transitional-state recording rule is loaded from metrics/rules and evaluated.
    (stuck,) = prometheus.wait_for("substrate_gpu:actors_transitional > 0")
    assert stuck["metric"]["state"] == "checkpointing"
    assert stuck["value"][1] == "1"

    # Prometheus negotiated OpenMetrics: the exemplar pointing at the actor arrived.
    now = time.time()
    exemplars = prometheus.get(
        "query_exemplars",
        query="substrate_gpu_checkpoint_refusals_total",
        start=str(now - 60),
        end=str(now + 60),
    )
    ids = {e["labels"]["actor_id"] for series in exemplars for e in series["exemplars"]}
    assert ids == {"actor-1"}

    # No alert fires on a healthy agent. (The checkpointing actor may make the stuck-actor
    # alert *pending* once the rules are evaluated; it needs 10 minutes to fire.)
    firing = [a for a in prometheus.get("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []


def test_every_dashboard_query_is_valid_promql(prometheus: PrometheusAPI) -> None:
    """Prometheus accepts every Grafana panel query (with Grafana's variable substituted)."""
    prometheus.wait_for("up")
    for expr in _dashboard_exprs():
        prometheus.query(expr.replace("$__rate_interval", "1m"))
