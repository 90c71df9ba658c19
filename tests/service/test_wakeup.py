"""Wakeup probes (:mod:`substrate_gpu.service.wakeup`): checked before anything runs, then
polled until 200 as upstream's ``wakeupprobe`` does, against a real HTTP server here."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import anyio
import pytest

from substrate_gpu.service import wakeup
from substrate_gpu.service.ateworker import ateworker_pb2 as pb


def _container(**probe: object) -> pb.Container:
    return pb.Container(name="app", wakeup_probe=pb.WakeupProbe(**probe))


@pytest.mark.parametrize(
    ("container", "message"),
    [
        pytest.param(_container(timeout_seconds=5), "http_get is required", id="no-http-get"),
        pytest.param(
            _container(http_get=pb.HTTPGetAction(path="/", port=0), timeout_seconds=5),
            "port 0 is not a port",
            id="port",
        ),
        pytest.param(
            _container(http_get=pb.HTTPGetAction(port=80), timeout_seconds=5),
            "path is required",
            id="path",
        ),
        pytest.param(
            _container(http_get=pb.HTTPGetAction(path="/", port=80)),
            "timeout_seconds must be positive, got 0",
            id="timeout",
        ),
    ],
)
def test_a_malformed_probe_is_refused_naming_its_field(container, message):
    with pytest.raises(wakeup.ProbeError, match=message) as caught:
        wakeup.check([pb.Container(name="side"), container])
    assert str(caught.value).startswith("spec.containers[1].wakeup_probe")


def test_containers_without_a_probe_have_no_gate():
    probe = _container(http_get=pb.HTTPGetAction(path="healthz", port=8080), timeout_seconds=3)
    assert wakeup.check([pb.Container(name="side"), probe]) == (
        wakeup.Probe("app", 8080, "/healthz", 3.0),
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    ready = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200 if self.ready.is_set() else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    _Handler.ready.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_wait_returns_once_the_server_says_200(server):
    """503s (and refusals) are retried every millisecond until the first 200."""
    threading.Timer(0.3, _Handler.ready.set).start()
    probe = wakeup.Probe("app", server.server_address[1], "/", 10.0)
    anyio.run(wakeup.wait_all, [probe], "127.0.0.1")
    assert _Handler.ready.is_set()


def test_wait_fails_after_the_timeout_saying_what_it_last_saw(server):
    probe = wakeup.Probe("app", server.server_address[1], "/", 1.0)
    with pytest.raises(wakeup.ProbeError, match=r"never returned 200 within 1s .*HTTP 503"):
        anyio.run(wakeup.wait_all, [probe], "127.0.0.1")
