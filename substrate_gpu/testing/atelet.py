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

:class:`SilentAtelet` (:func:`silent`) is the other kind of peer a worker must outlast: one
that accepts each connection on atelet's socket and never answers — not the TLS handshake, or
(given atelet's credentials) the handshake and then not the request it reads. It records when
each connection came and went, so a test sees how long the worker waited on each attempt and
how long it backed off between them.

Certificates with a SPIFFE URI SAN and a Pod identity are the caller's to make (the test
suite makes them with ``cryptography``: tests/support/spiffe.py).
"""

from __future__ import annotations

import contextlib
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h2.exceptions
from anyio.streams.tls import TLSStream

from substrate_gpu.service.atelet import atelet_pb2 as pb

__all__ = ["Answer", "FakeAtelet", "Held", "Received", "SilentAtelet", "serving", "silent"]

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


@dataclass
class Held:
    """One connection a :class:`SilentAtelet` accepted and never answered."""

    accepted_at: float
    """``time.monotonic()`` when it was accepted."""
    closed_at: float | None = None
    """When the worker closed it (None: still open)."""
    path: str | None = None
    """The ``:path`` of the request read on it (None: no request came, or no handshake)."""


@dataclass
class SilentAtelet:
    """A peer on atelet's socket that accepts and never answers (see the module doc)."""

    socket: Path
    tls: ssl.SSLContext | None = None
    """None: the TLS handshake is never answered; else it is, with this server context."""
    held: list[Held] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept on :attr:`socket` (replacing a file left there) until cancelled."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        async with await anyio.create_unix_listener(self.socket) as listener:
            task_status.started()
            await listener.serve(self._hold)

    async def _hold(self, stream: anyio.abc.ByteStream) -> None:
        held = Held(accepted_at=time.monotonic())
        self._note(held)
        try:
            if self.tls is not None:
                stream = await TLSStream.wrap(
                    stream, server_side=True, ssl_context=self.tls, standard_compatible=False
                )
                await self._read_request(stream, held)
            while True:  # what the worker sends is read, never answered
                await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError, OSError):
            pass
        finally:
            held.closed_at = time.monotonic()
            self._note(None)
            await anyio.aclose_forcefully(stream)

    @staticmethod
    async def _read_request(stream: anyio.abc.ByteStream, held: Held) -> None:
        """Read the HTTP/2 request's headers (what a gRPC server parses first); send nothing."""
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()  # its SETTINGS are never sent: this peer never answers
        while held.path is None:
            try:
                events = conn.receive_data(await stream.receive())
            except h2.exceptions.ProtocolError:
                return
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    headers = {bytes(k): bytes(v) for k, v in event.headers or ()}
                    held.path = headers.get(b":path", b"").decode("ascii", "replace")

    def _note(self, held: Held | None) -> None:
        if held is not None:
            self.held.append(held)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, connections: int, *, timeout: float = 20.0) -> list[Held]:
        """The connections held, once at least ``connections`` have come."""
        with anyio.fail_after(timeout):
            while len(self.held) < connections:
                await self._changed.wait()
        return list(self.held)

    async def wait_closed(self, held: Held, *, timeout: float = 20.0) -> None:
        """Until the worker closed ``held``."""
        with anyio.fail_after(timeout):
            while held.closed_at is None:
                await self._changed.wait()


def _server_context(
    certificate_chain: bytes, private_key: bytes, client_ca: bytes
) -> ssl.SSLContext:
    """atelet's side of the mutual TLS: its chain, client certificates of ``client_ca``
    required, TLS 1.3, ALPN ``h2``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=client_ca.decode("ascii"))
    with tempfile.TemporaryDirectory() as directory:  # OpenSSL reads a chain from files only
        chain, key = Path(directory) / "chain.pem", Path(directory) / "key.pem"
        chain.write_bytes(certificate_chain)
        key.write_bytes(private_key)
        context.load_cert_chain(chain, key)
    context.set_alpn_protocols(["h2"])
    return context


@contextlib.asynccontextmanager
async def silent(
    socket: Path,
    *,
    certificate_chain: bytes | None = None,
    private_key: bytes | None = None,
    client_ca: bytes | None = None,
) -> AsyncIterator[SilentAtelet]:
    """A :class:`SilentAtelet` on ``socket`` while inside: given atelet's credentials it
    answers the handshake and reads the request; without them, not even the handshake."""
    tls = None
    if certificate_chain is not None and private_key is not None and client_ca is not None:
        tls = _server_context(certificate_chain, private_key, client_ca)
    atelet = SilentAtelet(socket, tls)
    async with anyio.create_task_group() as tasks:
        await tasks.start(atelet.serve)
        try:
            yield atelet
        finally:
            tasks.cancel_scope.cancel()
            socket.unlink(missing_ok=True)
