"""/healthz and /readyz on the MetricsServer: status from the checks, a body naming them."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from substrate_gpu.observability.health import Check, Readiness, Report
from substrate_gpu.observability.http import MetricsServer
from substrate_gpu.observability.metrics import AgentMetrics

from .scrape import samples

LOOP_OK = Report("live", (Check("loop", True, "heartbeat 0.2 s ago"),))
ALL_READY = Report(
    "ready",
    (
        Check("event_log", True, "/s/events.jsonl open and locked"),
        Check("recovery", True, "finished: 2 actors resumed at seq 9"),
        Check("runsc", True, "runsc version v0 (3 s ago)"),
        Check("serving", True, "accepting requests"),
    ),
)
RUNSC_DOWN = Report(
    "ready",
    (
        Check("event_log", True, "/s/events.jsonl open and locked"),
        Check("recovery", True, "finished"),
        Check("runsc", False, "cannot start /usr/local/bin/runsc: No such file or directory"),
        Check("serving", True, "accepting requests"),
    ),
)


@dataclass
class Reports:
    """A health source answering whatever reports a test set."""

    live: Report = LOOP_OK
    ready: Report = ALL_READY

    def liveness(self) -> Report:
        return self.live

    def readiness(self) -> Report:
        return self.ready


def request(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def port(reports: Reports) -> Iterator[int]:
    registry = CollectorRegistry()
    AgentMetrics(registry)
    with MetricsServer(registry, port=0, health=reports) as server:
        yield server.port


def test_readyz_is_200_and_lists_every_check(port: int) -> None:
    """All checks passing: 200, ``ready``, then one ``ok <check>: <detail>`` line each."""
    status, headers, body = request(port, "/readyz")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert body.splitlines() == [
        "ready",
        "ok event_log: /s/events.jsonl open and locked",
        "ok recovery: finished: 2 actors resumed at seq 9",
        "ok runsc: runsc version v0 (3 s ago)",
        "ok serving: accepting requests",
    ]


def test_readyz_is_503_naming_the_failed_check(port: int, reports: Reports) -> None:
    """A failing check: 503, the first line names it, its line says why."""
    reports.ready = RUNSC_DOWN
    status, _, body = request(port, "/readyz")
    assert status == 503
    assert body.splitlines()[0] == "not ready: runsc"
    assert "failed runsc: cannot start /usr/local/bin/runsc" in body


def test_healthz_answers_from_liveness(port: int, reports: Reports) -> None:
    """``/healthz`` is the liveness report: 200 alive, 503 with the loop's failure."""
    assert request(port, "/healthz")[0::2] == (200, "live\nok loop: heartbeat 0.2 s ago\n")
    reports.live = Report("live", (Check("loop", False, "no heartbeat for 12.0 s"),))
    assert request(port, "/healthz")[0::2] == (
        503,
        "not live: loop\nfailed loop: no heartbeat for 12.0 s\n",
    )


def test_head_gets_the_status_without_a_body(port: int, reports: Reports) -> None:
    """HEAD: the probe's status and length, no body."""
    reports.ready = RUNSC_DOWN
    status, headers, body = request(port, "/readyz", "HEAD")
    assert (status, body) == (503, "")
    assert int(headers["Content-Length"]) == len(RUNSC_DOWN.body())


def test_other_methods_are_refused(port: int) -> None:
    """A probe path answers GET and HEAD only (405, with Allow)."""
    status, headers, _ = request(port, "/healthz", "POST")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


def test_metrics_are_still_served_beside_the_probes(port: int) -> None:
    """``/metrics`` is untouched by the probe routes."""
    status, _, body = request(port, "/metrics")
    assert status == 200
    assert "substrate_gpu_build_info{" in body


def test_without_a_health_source_the_probes_are_404_not_a_metrics_page() -> None:
    """A server without health never answers a probe path with 200."""
    with MetricsServer(CollectorRegistry(), port=0) as server:
        assert request(server.port, "/healthz")[0] == 404
        assert request(server.port, "/readyz")[0] == 404
        assert request(server.port, "/metrics")[0] == 200


def test_readiness_is_a_gauge_per_check(reports: Reports) -> None:
    """``substrate_gpu_agent_ready{check}`` is 1 per passing check, 0 per failing one, read
    at scrape time."""
    registry = CollectorRegistry()
    AgentMetrics(registry).report_readiness(reports.readiness)
    with MetricsServer(registry, port=0, health=reports) as server:

        def ready() -> dict[str, float]:
            return {
                s.labels["check"]: s.value
                for s in samples(request(server.port, "/metrics")[2])
                if s.name == "substrate_gpu_agent_ready"
            }

        assert ready() == dict.fromkeys(Readiness, 1.0)
        reports.ready = RUNSC_DOWN
        assert ready() == {**dict.fromkeys(Readiness, 1.0), "runsc": 0.0}
