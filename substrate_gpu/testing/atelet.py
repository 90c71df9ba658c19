"""A stand-in for atelet's worker-support service: a real gRPC server over mutual TLS.

:class:`FakeAtelet` serves ``atelet.WorkerSupport`` (our transcription of upstream's
``atelet.proto``, :mod:`substrate_gpu.service.atelet`) with grpcio's asyncio server on a
Unix socket, as atelet serves ``/var/lib/ate/worker-support.sock``: TLS with the certificate
it is given, client certificates *required* and verified against the CA it is given (the Pod
identity signer's trust bundle). So a worker's report is parsed by a real gRPC
implementation, and a worker without a certificate of that signer is refused by the
handshake, as by atelet.

What it does on ``RegisterWorker``: records the request and the client's certificate, then
answers the next of ``answers`` (``None``: OK; a ``(code, message)``: that status), OK once
they are spent — atelet answers an error until the control plane has recorded the report.
The other two methods are not served (``UNIMPLEMENTED``, grpcio's own answer).

Certificates with a SPIFFE URI SAN and a Pod identity are the caller's to make (the test
suite makes them with ``cryptography``: tests/support/spiffe.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio

from substrate_gpu.service.atelet import atelet_pb2 as pb

__all__ = ["Answer", "FakeAtelet", "Received"]

Answer = tuple[grpc.StatusCode, str] | None
"""One answer to ``RegisterWorker``: None for OK, else the status and its message."""


@dataclass(frozen=True)
class Received:
    """One ``RegisterWorker`` call as atelet saw it."""

    request: pb.RegisterWorkerRequest
    peer_certificate: bytes
    """The client's certificate (PEM), from the TLS session: who reported."""


@dataclass
class FakeAtelet:
    """atelet's worker-support socket (see the module doc); ``async with`` serves it."""

    socket: Path
    certificate_chain: bytes
    """atelet's certificate chain (PEM, leaf first)."""
    private_key: bytes
    """Its key (PEM)."""
    client_ca: bytes
    """The CA a worker's certificate must chain to (PEM)."""
    answers: list[Answer] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    _server: Any = None
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegisterWorkerResponse:
        auth = context.auth_context()
        peer = b"".join(auth.get("x509_pem_cert", []))
        self.received.append(Received(request, peer))
        self._changed.set()
        self._changed = anyio.Event()
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            await context.abort(*answer)
        return pb.RegisterWorkerResponse()

    async def start(self) -> None:
        """Serve on :attr:`socket` (replacing a file left there)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        service = pb.DESCRIPTOR.services_by_name["WorkerSupport"]
        method = service.methods_by_name["RegisterWorker"]
        handler = grpc.method_handlers_generic_handler(
            service.full_name,
            {
                method.name: grpc.unary_unary_rpc_method_handler(
                    self.RegisterWorker,
                    request_deserializer=pb.RegisterWorkerRequest.FromString,
                    response_serializer=pb.RegisterWorkerResponse.SerializeToString,
                )
            },
        )
        credentials = grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=True,
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_secure_port(f"unix:{self.socket}", credentials)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and remove the socket (atelet gone, or restarting)."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        self.socket.unlink(missing_ok=True)

    async def wait_for(self, calls: int, *, timeout: float = 20.0) -> list[Received]:
        """The calls received, once there are at least ``calls`` of them."""
        with anyio.fail_after(timeout):
            while len(self.received) < calls:
                await self._changed.wait()
        return list(self.received)

    async def __aenter__(self) -> FakeAtelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()


@contextlib.asynccontextmanager
async def serving(
    socket: Path,
    *,
    certificate_chain: bytes,
    private_key: bytes,
    client_ca: bytes,
    answers: Iterable[Answer] = (),
) -> AsyncIterator[FakeAtelet]:
    """A :class:`FakeAtelet` serving while inside."""
    atelet = FakeAtelet(socket, certificate_chain, private_key, client_ca, list(answers))
    async with atelet:
        yield atelet
