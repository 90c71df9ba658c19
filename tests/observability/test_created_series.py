"""The agent's metrics carry no ``_created`` series: one timestamp per counter and histogram
series (189 of 1,093 lines of a real scrape) that no rule, alert or dashboard reads."""

from __future__ import annotations

from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition as openmetrics
from service.agentproc import AgentProcess

from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.observability.registry import AgentRegistry

from .prometheus_server import free_port
from .scrape import fetch


def _metric_names(exposition: str) -> set[str]:
    """Every series name of an exposition (HELP/TYPE names included), labels ignored."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def _created(exposition: str) -> set[str]:
    return {name for name in _metric_names(exposition) if name.endswith("_created")}


def _exercised(registry: CollectorRegistry) -> CollectorRegistry:
    metrics = AgentMetrics(registry, actor_states=dict)
    metrics.transition("registered", "running", "run_requested")
    metrics.checkpoint_refused("live_context_probed")
    metrics.toolkit_generation("ok", 0.4)
    return registry


def test_a_plain_registry_would_expose_created_series() -> None:
    """The comparison: prometheus-client adds `_created` to every counter and histogram."""
    assert _created(prometheus_client.generate_latest(_exercised(CollectorRegistry())).decode())


@pytest.mark.parametrize(
    "render",
    [
        pytest.param(prometheus_client.generate_latest, id="classic-text"),
        pytest.param(openmetrics.generate_latest, id="openmetrics"),
    ],
)
def test_the_agent_registry_exposes_no_created_series(render) -> None:
    """Rendered in either format, the agent's registry has no `_created` line left."""
    text = render(_exercised(AgentRegistry())).decode()
    assert _created(text) == set()
    assert "substrate_gpu_actor_transitions_total" in _metric_names(text)
    assert "substrate_gpu_toolkit_generation_duration_seconds_count" in _metric_names(text)


def test_the_running_agents_metrics_endpoint_has_no_created_series(tmp_path: Path) -> None:
    """A scrape of the agent process's /metrics: no `_created` series, the counters there."""
    port = free_port()
    agent = AgentProcess.on_socket(tmp_path, "--metrics-port", str(port))
    try:
        _, text = fetch(f"http://127.0.0.1:{port}/metrics")
    finally:
        assert agent.terminate() == 0, agent.stderr()
    assert _created(text) == set()
    assert "substrate_gpu_actor_transitions_total" in _metric_names(text)
