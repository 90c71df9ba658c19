"""One unary gRPC call over a byte stream we opened ourselves (HTTP/2 by ``h2``).

gRPC's wire is HTTP/2 (the "gRPC over HTTP2" protocol): a ``POST`` of ``:path
/<package>.<Service>/<Method>`` with ``content-type: application/grpc`` and ``te:
trailers``, a body of length-prefixed messages (one flag byte, four bytes of big-endian
length, the message), and an answer of headers, the length-prefixed response, then trailers
carrying ``grpc-status`` and ``grpc-message`` (or a *trailers-only* answer: one HEADERS frame
with the status). That is all a unary call needs, and :func:`unary_call` does exactly that
over a stream the caller has connected and verified (:mod:`.atelet_dial`): python-hyper's
``h2`` keeps the HTTP/2 state (framing, HPACK, flow control, SETTINGS); this module only
speaks gRPC's rules on top.

Statuses are grpcio's :class:`grpc.StatusCode`; an answer that is no valid gRPC answer (an
HTTP status other than 200, a stream reset, the connection closing first) gets the code the
gRPC spec maps it to, so a caller classifies every failure the same way.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import anyio
import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
from anyio.abc import ByteStream

from substrate_gpu import _version, exceptions

__all__ = ["ALPN", "GrpcError", "unary_call"]

ALPN: Final = "h2"
"""The TLS ALPN protocol gRPC servers require."""

_STATUS_BY_CODE: Final = {code.value[0]: code for code in grpc.StatusCode}

#: The gRPC spec's mapping of an HTTP status that is not 200 (no grpc-status came).
_HTTP_TO_GRPC: Final = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}

_READ_SIZE: Final = 65536


class GrpcError(exceptions.SubstrateGpuError):
    """The call ended without an OK answer: ``code`` says how (a status, or a broken stream)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message


def _user_agent() -> str:
    return f"substrate-gpu/{_version.VERSION} grpc-h2"


def _grpc_timeout(seconds: float) -> str:
    """A ``grpc-timeout`` header value: at most 8 digits, in milliseconds."""
    return f"{max(1, min(99_999_999, round(seconds * 1000)))}m"


def _frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass
class _Answer:
    """What came back on the call's stream."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False


def _decode(headers: Iterable[tuple[bytes | str, bytes | str]] | None) -> dict[str, str]:
    decoded: dict[str, str] = {}
    for name, value in headers or ():
        key = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
        decoded[key.lower()] = (
            value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        )
    return decoded


class _Call:
    """One stream of one HTTP/2 connection, driven until its answer is complete."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.answer = _Answer()
        self.stream_id = 0

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send(data)

    async def pump(self) -> None:
        """Read once from the connection and handle what arrived."""
        try:
            data = await self.stream.receive(_READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError) as e:
            raise GrpcError(
                grpc.StatusCode.UNAVAILABLE, "the connection closed before the answer ended"
            ) from e
        try:
            received = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            raise GrpcError(grpc.StatusCode.INTERNAL, f"HTTP/2 protocol error: {e}") from e
        for event in received:
            self.handle(event)
        await self.flush()

    def handle(self, event: h2.events.Event) -> None:
        answer = self.answer
        if isinstance(event, h2.events.ResponseReceived):
            answer.headers = _decode(event.headers)
        elif isinstance(event, h2.events.TrailersReceived):
            answer.trailers = _decode(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            answer.body += event.data or b""
            if event.flow_controlled_length and event.stream_id is not None:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == self.stream_id:
            answer.ended = True
        elif isinstance(event, h2.events.StreamReset) and event.stream_id == self.stream_id:
            code = event.error_code
            raise GrpcError(
                # REFUSED_STREAM: the server did not process it; any other reset: internal.
                grpc.StatusCode.UNAVAILABLE if code == 7 else grpc.StatusCode.INTERNAL,
                f"the server reset the stream (HTTP/2 error {code!s})",
            )
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise GrpcError(
                grpc.StatusCode.UNAVAILABLE,
                f"the server closed the connection (GOAWAY, HTTP/2 error {event.error_code!s})",
            )

    async def send_body(self, body: bytes) -> None:
        """Send ``body`` and end the stream, within the peer's flow-control windows."""
        sent = 0
        while sent < len(body) and not self.answer.ended:
            window = min(
                self.conn.local_flow_control_window(self.stream_id),
                self.conn.max_outbound_frame_size,
            )
            if window <= 0:
                await self.pump()  # wait for a WINDOW_UPDATE
                continue
            chunk = body[sent : sent + window]
            sent += len(chunk)
            self.conn.send_data(self.stream_id, chunk, end_stream=sent == len(body))
            await self.flush()


async def unary_call(
    stream: ByteStream, *, authority: str, path: str, request: bytes, timeout: float
) -> bytes:
    """Call ``path`` (``/pkg.Service/Method``) with the serialised ``request`` on a fresh
    HTTP/2 connection over ``stream``; the serialised response. :class:`GrpcError` unless
    the server answered OK. ``timeout`` is sent as ``grpc-timeout`` (the caller enforces it)."""
    call = _Call(stream)
    call.conn.initiate_connection()
    call.stream_id = call.conn.get_next_available_stream_id()
    call.conn.send_headers(
        call.stream_id,
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", path.encode("ascii")),
            (b":authority", authority.encode("ascii")),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", _user_agent().encode("ascii")),
            (b"grpc-timeout", _grpc_timeout(timeout).encode("ascii")),
        ],
    )
    await call.flush()
    await call.send_body(_frame(request))
    while not call.answer.ended:
        await call.pump()
    # Be polite: the call is over and the connection goes with it.
    call.conn.close_connection()
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await call.flush()
    return _response(call.answer)


def _response(answer: _Answer) -> bytes:
    """The response message of a complete answer, or the :class:`GrpcError` it carries."""
    http_status = answer.headers.get(":status", "")
    # Trailers-only: the status is in the (only) headers.
    status = answer.trailers or answer.headers
    if http_status != "200":
        code = _HTTP_TO_GRPC.get(int(http_status) if http_status.isdigit() else 0)
        raise GrpcError(
            code or grpc.StatusCode.UNKNOWN,
            f"the server answered HTTP {http_status or 'nothing'}, not a gRPC answer",
        )
    raw = status.get("grpc-status")
    if raw is None or not raw.isdigit():
        raise GrpcError(grpc.StatusCode.UNKNOWN, f"the answer has no valid grpc-status ({raw!r})")
    code = _STATUS_BY_CODE.get(int(raw), grpc.StatusCode.UNKNOWN)
    if code is not grpc.StatusCode.OK:
        raise GrpcError(code, urllib.parse.unquote(status.get("grpc-message", "")))
    body = bytes(answer.body)
    if len(body) < 5:
        raise GrpcError(grpc.StatusCode.INTERNAL, "an OK answer without a response message")
    compressed, length = body[0], int.from_bytes(body[1:5], "big")
    if compressed:
        raise GrpcError(grpc.StatusCode.INTERNAL, "a compressed response (none was accepted)")
    if len(body) != 5 + length:
        raise GrpcError(
            grpc.StatusCode.INTERNAL,
            f"the response is {len(body) - 5} bytes, its prefix says {length}: not one message",
        )
    return body[5:]
