"""Serving a metrics registry over HTTP, on loopback unless told otherwise.

prometheus-client's ``start_http_server`` binds ``0.0.0.0`` by default and returns a server
nobody stops; :class:`MetricsServer` wraps it with the node agent's defaults (127.0.0.1, a
configurable port, port 0 for an ephemeral one) and a clean start/stop, usable from plain
code (``with``) and from an anyio application (``async with``: stopping runs in a worker
thread so the event loop is never blocked). Content negotiation is prometheus-client's:
``Accept: application/openmetrics-text`` gets OpenMetrics (with exemplars), anything else
the classic text format.

**Bursts and slow clients.** prometheus-client's server listens with socketserver's backlog
of 5: under 50 concurrent scrapers the kernel drops connection attempts, which the clients
see as 1 s+ stalls or timeouts. Ours listens with :data:`LISTEN_BACKLOG`, serves each
connection in a daemon thread, and gives every connection ``timeout`` seconds per read or
write, so a client that connects and sends nothing holds a thread for that long, not forever.

**Health.** Given a :class:`~substrate_gpu.observability.health.HealthSource`, the same server
answers ``GET /healthz`` and ``GET /readyz`` (200 or 503, a plain-text body naming each
check; see :mod:`~substrate_gpu.observability.health`). The probes share the metrics port on
purpose: one port to declare in a pod, and a probe answered from the server's own thread
still tells a blocked event loop apart from a dead process.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anyio.to_thread
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from substrate_gpu import _defaults, exceptions
from substrate_gpu.observability import health as health_

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "LIVENESS_PATH", "READINESS_PATH", "MetricsServer"]

DEFAULT_HOST: Final = _defaults.METRICS_HOST
"""Loopback: a node agent's metrics are scraped locally or through a deliberate choice."""

DEFAULT_PORT: Final = _defaults.METRICS_PORT
"""The agent's metrics port (``--metrics-port``); 0 asks the kernel for a free one."""

DEFAULT_TIMEOUT: Final = 10.0
"""Seconds a scrape connection may take per read or write before it is closed."""

LISTEN_BACKLOG: Final = 1024
"""Connections the kernel queues before accepting (the kernel caps it at somaxconn)."""

LIVENESS_PATH: Final = "/healthz"
"""Liveness: 200 while the agent's event loop runs (:class:`health.Liveness`)."""

READINESS_PATH: Final = "/readyz"
"""Readiness: 200 while the agent can take requests (:class:`health.Readiness`)."""


class _Server(ThreadingWSGIServer):
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that timed out or hung up is routine, not a traceback on stderr.
        pass


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _with_health(metrics: WSGIApplication, source: health_.HealthSource | None) -> WSGIApplication:
    """``metrics``, with ``/healthz`` and ``/readyz`` answered from ``source`` (404 without
    one: a probe must never read a metrics page as "healthy")."""
    probes: dict[str, Callable[[], health_.Report] | None] = {
        LIVENESS_PATH: source.liveness if source is not None else None,
        READINESS_PATH: source.readiness if source is not None else None,
    }

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in probes:
            return metrics(environ, start_response)
        probe = probes[path]
        if probe is None:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"no health source: this server serves metrics only\n"]
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response(
                "405 Method Not Allowed",
                [("Content-Type", "text/plain; charset=utf-8"), ("Allow", "GET, HEAD")],
            )
            return [b"only GET and HEAD\n"]
        report = probe()
        body = report.body()
        reason = "OK" if report.ok else "Service Unavailable"
        start_response(
            f"{report.status} {reason}",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [] if method == "HEAD" else [body]

    return app


class MetricsServer:
    """Serves ``registry`` on ``http://host:port/metrics`` in a daemon thread while entered.

    ``port`` and ``url`` give the bound address (the real port when 0 was asked for). With
    ``health``, ``/healthz`` and ``/readyz`` are answered too.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        timeout: float = DEFAULT_TIMEOUT,
        health: health_.HealthSource | None = None,
    ) -> None:
        self._registry = registry
        self._health = health
        self._host = host
        self._requested_port = port
        self._timeout = timeout
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The bound port; raises when the server is not running."""
        if self._server is None:
            raise exceptions.SubstrateGpuError(
                "while reading the metrics server's port: the server is not running; "
                "enter the MetricsServer context first"
            )
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The metrics endpoint, e.g. ``http://127.0.0.1:9477/metrics``."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        """Bind and start serving; a second call is an error."""
        if self._server is not None:
            raise exceptions.SubstrateGpuError(
                f"while starting the metrics server on {self._host}: it is already running"
            )
        try:
            family = socket.getaddrinfo(
                self._host, self._requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0][0]
            server_class = type("_BoundServer", (_Server,), {"address_family": family})
            handler_class = type("_TimedHandler", (_Handler,), {"timeout": self._timeout})
            app = _with_health(make_wsgi_app(self._registry), self._health)
            server: WSGIServer = make_server(
                self._host,
                self._requested_port,
                app,
                server_class=server_class,
                handler_class=handler_class,
            )
        except OSError as e:
            raise exceptions.ConfigError(
                f"while starting the metrics server on {self._host}:{self._requested_port}: "
                f"{e.strerror or e}; choose another --metrics-port or --metrics-host"
            ) from e
        thread = threading.Thread(
            target=server.serve_forever, name="substrate-gpu-metrics", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread

    def stop(self) -> None:
        """Stop serving and release the port; a no-op when not running."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        # Binding is a few syscalls: safe on the event loop.
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # shutdown() waits for the serve loop's next poll (up to 0.5 s): off the event loop,
        # and shielded so a cancelled task still releases the port.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)
