"""Wakeup probes: a Run or Restore answers once each probed app container's HTTP server says
200, as upstream's worker (``internal/wakeupprobe`` at ``533900d``, ``WaitAll``).

Each container whose spec has a ``wakeup_probe`` is polled, all at once: ``GET
http://<address>:<port><path>`` every :data:`POLL_INTERVAL` (1 ms: while the server boots the
kernel answers a connect with a reset in microseconds), each try bounded by
:data:`REQUEST_TIMEOUT` (250 ms), until one answers 200 or ``timeout_seconds`` pass. The
address is the sandbox's: here the worker pod's own (``--sandbox-network pod``: 127.0.0.1),
where upstream dials the actor's veth. A probe is checked before anything runs (``http_get``
with a port 1-65535 and a path, ``timeout_seconds`` positive); upstream checks it only once
the sandbox booted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import anyio

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

log = get_logger(__name__)

REQUEST_TIMEOUT: Final = 0.25
POLL_INTERVAL: Final = 0.001


class ProbeError(exceptions.SubstrateGpuError):
    """A probe is malformed (the request's fault) or never answered 200 in time."""


@dataclass(frozen=True)
class Probe:
    """One app container's wakeup probe."""

    container: str
    port: int
    path: str
    timeout: float
    """``timeout_seconds``."""


def check(containers: Iterable[pb.Container]) -> tuple[Probe, ...]:
    """The probes of ``spec.containers``, in order; a :class:`ProbeError` naming the field of
    a malformed one."""
    probes = []
    for i, container in enumerate(containers):
        if not container.HasField("wakeup_probe"):
            continue
        probe = container.wakeup_probe
        where = f"spec.containers[{i}].wakeup_probe"
        if not probe.HasField("http_get"):
            raise ProbeError(f"{where}.http_get is required")
        port, path = probe.http_get.port, probe.http_get.path
        if not 1 <= port <= 65535:
            raise ProbeError(f"{where}.http_get.port {port} is not a port (1-65535)")
        if not path:
            raise ProbeError(f"{where}.http_get.path is required")
        if probe.timeout_seconds <= 0:
            raise ProbeError(
                f"{where}.timeout_seconds must be positive, got {probe.timeout_seconds}"
            )
        path = path if path.startswith("/") else f"/{path}"
        probes.append(Probe(container.name, port, path, float(probe.timeout_seconds)))
    return tuple(probes)


async def wait_all(probes: Iterable[Probe], address: str) -> None:
    """Until every probe answered 200 (all polled at once); the first failure raised."""
    failures: list[ProbeError] = []

    async def one(probe: Probe) -> None:
        try:
            await wait(probe, address)
        except ProbeError as e:
            failures.append(e)
            group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        for probe in probes:
            group.start_soon(one, probe)
    if failures:
        raise failures[0]


async def wait(probe: Probe, address: str) -> None:
    """Poll ``probe`` until 200, or a :class:`ProbeError` after its timeout."""
    url = f"http://{address}:{probe.port}{probe.path}"
    start = anyio.current_time()
    attempts, last = 0, "none"
    while True:
        if anyio.current_time() - start > probe.timeout:
            raise ProbeError(
                f"wakeup probe for {probe.container!r} ({url}) never returned 200 within "
                f"{probe.timeout:g}s ({attempts} attempts, last: {last})"
            )
        attempts += 1
        try:
            with anyio.fail_after(REQUEST_TIMEOUT):
                status = await _get(address, probe.port, probe.path)
        except (OSError, TimeoutError, anyio.EndOfStream, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if status == 200:
                log.info(
                    "wakeup probe reached 200",
                    container=probe.container,
                    url=url,
                    elapsed=round(anyio.current_time() - start, 4),
                    attempts=attempts,
                )
                return
            last = f"HTTP {status}"
        await anyio.sleep(POLL_INTERVAL)


async def _get(address: str, port: int, path: str) -> int:
    """One ``GET``; the response's status code."""
    async with await anyio.connect_tcp(address, port) as stream:
        request = f"GET {path} HTTP/1.1\r\nHost: {address}:{port}\r\nConnection: close\r\n\r\n"
        await stream.send(request.encode())
        head = b""
        while b"\r\n" not in head and len(head) < 8192:
            head += await stream.receive()
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response: {head[:40]!r}")
    return int(status_line[1])
