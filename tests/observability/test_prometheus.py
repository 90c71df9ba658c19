"""A real Prometheus scrapes a MetricsServer with the project's config and rules.

The project's ``metrics/prometheus.yml`` is rendered with the test's target and a 1 s
scrape/evaluation interval; everything else (job name, rule files) is used as written.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from substrate_gpu.observability import AgentMetrics, MetricsServer

from .conftest import METRICS_DIR
from .test_compose import _dashboard_exprs

DEADLINE_S = 12.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Prometheus:
    def __init__(self, port: int) -> None:
        self.api = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.api}/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=2) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a non-empty result (or the deadline)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                result = self.query(expr)
            except OSError:
                result = []
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never returned a result for {expr}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def agent_metrics() -> Iterator[tuple[MetricsServer, AgentMetrics]]:
    registry = CollectorRegistry()
    m = AgentMetrics(
        registry, actor_states=lambda: {"running": 3, "checkpointing": 1, "suspended": 2}
    )
    m.transition("running", "probing", "suspend", actor_id="actor-1")
    m.checkpoint_refused("live_cuda_context", actor_id="actor-1")
    m.effect_finished("inject_gpu", "ok", 0.004, actor_id="actor-1")
    with MetricsServer(registry, port=0) as server:
        yield server, m


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str,
    agent_metrics: tuple[MetricsServer, AgentMetrics],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_Prometheus]:
    server, _ = agent_metrics
    tmp_path = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((METRICS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(METRICS_DIR / pattern) for pattern in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield _Prometheus(port)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_real_prometheus_scrapes_rules_and_exemplars(
    prometheus: _Prometheus, agent_metrics: tuple[MetricsServer, AgentMetrics]
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


def test_every_dashboard_query_is_valid_promql(prometheus: _Prometheus) -> None:
    """Prometheus accepts every Grafana panel query (with Grafana's variable substituted)."""
    prometheus.wait_for("up")
    for expr in _dashboard_exprs():
        prometheus.query(expr.replace("$__rate_interval", "1m"))
