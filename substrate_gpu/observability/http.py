"""Serving a metrics registry over HTTP, on loopback unless told otherwise.

prometheus-client's ``start_http_server`` binds ``0.0.0.0`` by default and returns a server
nobody stops; :class:`MetricsServer` wraps it with the node agent's defaults (127.0.0.1, a
configurable port, port 0 for an ephemeral one) and a clean start/stop, usable from plain
code (``with``) and from an anyio application (``async with``: stopping runs in a worker
thread so the event loop is never blocked). Content negotiation is prometheus-client's:
``Accept: application/openmetrics-text`` gets OpenMetrics (with exemplars), anything else
the classic text format.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Final, Self
from wsgiref.simple_server import WSGIServer

import anyio.to_thread
from prometheus_client import CollectorRegistry, start_http_server

from substrate_gpu import exceptions

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "MetricsServer"]

DEFAULT_HOST: Final = "127.0.0.1"
"""Loopback: a node agent's metrics are scraped locally or through a deliberate choice."""

DEFAULT_PORT: Final = 9477
"""The agent's metrics port (``--metrics-port``); 0 asks the kernel for a free one."""


class MetricsServer:
    """Serves ``registry`` on ``http://host:port/metrics`` in a daemon thread while entered.

    ``port`` and ``url`` give the bound address (the real port when 0 was asked for).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
    ) -> None:
        self._registry = registry
        self._host = host
        self._requested_port = port
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
            server, thread = start_http_server(
                self._requested_port, addr=self._host, registry=self._registry
            )
        except OSError as e:
            raise exceptions.ConfigError(
                f"while starting the metrics server on {self._host}:{self._requested_port}: "
                f"{e.strerror or e}; choose another --metrics-port or --metrics-host"
            ) from e
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
