"""docker-compose.yml and the Grafana files: wiring checked without a Docker engine."""

from __future__ import annotations

import collections
import json
import re
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from substrate_gpu.observability.http import DEFAULT_PORT
from substrate_gpu.observability.metrics import AgentMetrics

from .conftest import METRICS_DIR, REPO
from .scrape import samples

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PROMETHEUS_CONFIG: dict[str, Any] = yaml.safe_load((METRICS_DIR / "prometheus.yml").read_text())


def _flag(command: list[str], name: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in an argv."""
    for i, arg in enumerate(command):
        if arg == name:
            return command[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


def _mounts(service: str) -> dict[str, str]:
    """Container path → host path (relative to the repo) of a service's bind mounts."""
    mounts = {}
    for volume in SERVICES[service].get("volumes", []):
        host, container, *_ = volume.split(":")
        mounts[container] = host
    return mounts


def _host_path(service: str, container_path: str) -> Any:
    """The repo path a container path of ``service`` resolves to through its mounts."""
    target = PurePosixPath(container_path)
    for container, host in _mounts(service).items():
        if target == PurePosixPath(container) or PurePosixPath(container) in target.parents:
            return REPO / host / target.relative_to(container)
    raise AssertionError(f"{container_path} is not mounted into {service}")


def _agent_port() -> int:
    return int(_flag(SERVICES["agent"]["command"], "--metrics-port"))


def test_every_published_port_is_bound_to_loopback() -> None:
    """No service is reachable from the network: every ports entry starts with 127.0.0.1."""
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_agent_runs_the_demo_and_publishes_its_metrics_port() -> None:
    """The agent runs in demo mode, listens on all interfaces inside its network, port published."""
    command = SERVICES["agent"]["command"]
    assert "--demo" in command
    assert _flag(command, "--metrics-host") == "0.0.0.0"
    port = _agent_port()
    assert port == DEFAULT_PORT
    assert f"127.0.0.1:{port}:{port}" in SERVICES["agent"]["ports"]


def test_agent_is_built_from_the_repo_dockerfile() -> None:
    """build: the repository, target ``demo``: a stage of the Dockerfile (tests/image checks it)."""
    assert SERVICES["agent"]["build"] == {"context": ".", "target": "demo"}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+ AS demo$", dockerfile, re.MULTILINE)


def test_every_bind_mount_points_at_a_file_that_exists() -> None:
    """Each ./host:container volume names a path present in the repository."""
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (REPO / host).exists(), f"{name}: {volume}"


def test_prometheus_scrapes_the_agent_service_on_its_metrics_port() -> None:
    """The scrape target is the compose service name and the agent's --metrics-port."""
    (job,) = [
        j for j in PROMETHEUS_CONFIG["scrape_configs"] if j["job_name"] == "substrate-gpu-agent"
    ]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"agent:{_agent_port()}"]
    assert "agent" in SERVICES


def test_prometheus_loads_the_mounted_config_and_rules() -> None:
    """--config.file is the mounted metrics/prometheus.yml; its rule_files glob hits mounted rules."""
    command = SERVICES["prometheus"]["command"]
    config = _flag(command, "--config.file")
    assert _host_path("prometheus", config).resolve() == (METRICS_DIR / "prometheus.yml").resolve()
    config_dir = PurePosixPath(config).parent
    for pattern in PROMETHEUS_CONFIG["rule_files"]:
        container_glob = config_dir / pattern
        host_dir = _host_path("prometheus", str(container_glob.parent))
        assert list(host_dir.glob(container_glob.name)), pattern


def test_grafana_datasource_points_at_the_prometheus_service() -> None:
    """The provisioned datasource URL is the prometheus service on its listen port."""
    provisioning = _host_path("grafana", "/etc/grafana/provisioning")
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    port = _flag(SERVICES["prometheus"]["command"], "--web.listen-address").rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{port}"
    assert "127.0.0.1:9090:9090" in SERVICES["prometheus"]["ports"]


def test_grafana_dashboards_are_provisioned_from_the_mounted_folder() -> None:
    """The dashboard provider's path is a mounted folder holding the dashboard JSON."""
    provisioning = _host_path("grafana", "/etc/grafana/provisioning")
    providers = yaml.safe_load((provisioning / "dashboards" / "substrate-gpu.yml").read_text())
    (provider,) = providers["providers"]
    folder = _host_path("grafana", provider["options"]["path"])
    assert list(folder.glob("*.json"))


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(
        (METRICS_DIR / "grafana" / "dashboards" / "substrate-gpu.json").read_text()
    )
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def _known_series_names() -> set[str]:
    registry = CollectorRegistry()
    m = AgentMetrics(registry, actor_states=collections.Counter, queue_depth=lambda: 0)
    m.devices_injected(1)
    m.event_log_append(0.001, 1)
    m.injection_hook_skipped("chmod")
    exported = {s.name for s in samples(generate_latest(registry).decode())}
    recorded = {
        rule["record"]
        for path in (METRICS_DIR / "rules").glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    return exported | recorded


@pytest.mark.parametrize("expr", _dashboard_exprs())
def test_dashboard_queries_name_only_real_series(expr: str) -> None:
    """Every series a dashboard panel queries is exported by AgentMetrics or recorded by a rule."""
    names = set(re.findall(r"substrate_gpu[a-z0-9_:]*", expr))
    assert names
    assert names <= _known_series_names()
