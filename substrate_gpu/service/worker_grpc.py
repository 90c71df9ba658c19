"""The worker API on its Unix socket: gRPC in (grpcio's asyncio server, on the agent's own
event loop), :class:`~.worker_api.WorkerService`'s calls out.

- **Every method from the descriptor** (:func:`handler`): a method of the .proto without its
  implementation fails at once, not at its first call.
- **A call's errors end at the call.** A :class:`~.worker_calls.CallError` is its status, a
  bad request ``INVALID_ARGUMENT`` naming the field, anything unexpected ``INTERNAL``; a body
  that is not a message of the method's type is :class:`Undecodable` (grpcio would answer a
  deserializer's exception with an opaque status). The agent stays up whatever comes.
- **Bounded connections** (:func:`serving`, ``--max-worker-clients``), and what gRPC core
  does not say about them said in the log (:func:`watch_connections`).
- **Reflection** is served, as upstream's worker serves it: grpcurl works without the .proto.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import anyio
import anyio.abc
import anyio.to_thread
import grpc
import grpc.aio
from google.protobuf import message

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.service import _socketfile, reflection, worker_requests
from substrate_gpu.service import config as config_
from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.service.worker_api import LIFECYCLE_CALLS, SERVICE, WorkerService
from substrate_gpu.service.worker_calls import CallError

log = get_logger(__name__)

#: gRPC core's bound on a server's incoming connections (its
#: ``GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS``).
MAX_CONNECTIONS_OPTION: Final = "grpc.max_allowed_incoming_connections"
#: Seconds between two counts of the worker socket's connections (:func:`watch_connections`).
WATCH_INTERVAL: Final = 2.0
#: Seconds connections may wait in the worker socket's backlog before it is said not to accept.
STALLED_AFTER: Final = 10.0


def handler(worker: WorkerService) -> grpc.GenericRpcHandler:
    """``worker``'s answer to every method of :data:`SERVICE`, from the descriptor (a method
    without its implementation there fails at once, not at its first call)."""
    table = {}
    for method in SERVICE.methods:
        request_class = getattr(pb, method.input_type.name)
        table[method.name] = grpc.unary_unary_rpc_method_handler(
            _answering(worker, method.name, getattr(worker, method.name)),
            request_deserializer=functools.partial(_deserialize, request_class),
            response_serializer=_serialize,
        )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, table)


def _answering(
    worker: WorkerService, name: str, call: Callable[[Any], Awaitable[message.Message]]
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[message.Message]]:
    """``call`` with its errors turned into statuses; the agent stays up whatever comes."""

    @functools.wraps(call)
    async def answer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> message.Message:
        token = id(request)
        if name in LIFECYCLE_CALLS:
            worker.in_flight[token] = name
        try:
            _check_request(request)
            return await call(request)
        except CallError as e:
            log.info("worker call answered", call=name, code=e.code.name, error=e.message)
            await context.abort(e.code, e.message)
        except worker_requests.BadRequest as e:
            log.info("worker call refused", call=name, code="INVALID_ARGUMENT", error=str(e))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # the call's boundary: see the module doc
            log.exception("worker call failed unexpectedly", call=name)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"{name}: unexpected {type(e).__name__}: {e}"
            )
        finally:
            worker.in_flight.pop(token, None)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    return answer


def _serialize(response: message.Message) -> bytes:
    return response.SerializeToString()


@dataclass(frozen=True)
class Undecodable:
    """A request body that is not a message of its method's type (corrupt, or a string that
    is not UTF-8): answered INVALID_ARGUMENT (grpcio would answer a deserializer's exception
    with an opaque status)."""

    type_name: str
    error: str

    def __str__(self) -> str:
        return f"the request is not a valid {self.type_name} message: {self.error}"


def _check_request(request: message.Message | Undecodable) -> None:
    """Before a call reads its request: a message, every string within its bound."""
    if isinstance(request, Undecodable):
        raise worker_requests.BadRequest(str(request))
    worker_requests.check_sizes(request)


def _deserialize(
    request_class: type[message.Message], data: bytes
) -> message.Message | Undecodable:
    try:
        return request_class.FromString(data)
    except (message.DecodeError, RecursionError) as e:
        return Undecodable(request_class.DESCRIPTOR.full_name, str(e)[:200] or type(e).__name__)


@contextlib.asynccontextmanager
async def serving(
    worker: WorkerService,
    path: Path,
    claim: Callable[[Path], None],
    tasks: anyio.abc.TaskGroup,
    *,
    max_clients: int = config_.DEFAULT_MAX_WORKER_CLIENTS,
) -> AsyncIterator[None]:
    """Serve ``worker`` on the Unix socket ``path`` (mode 0600) while inside, its calls
    run in ``tasks`` (:meth:`WorkerService.hosted_in`).

    ``claim`` replaces a stale socket file and refuses one another process serves (the
    JSON socket's rule). At most ``max_clients`` connections are held (``--max-worker-clients``):
    gRPC core closes one more as it accepts it, before reading a byte of it, and retries
    an accept that found no descriptor (EMFILE) a second later. On leaving, calls in
    progress get a moment to answer.
    """
    _socketfile.make_private_dir(path, "worker socket", "choose another --worker-socket")
    claim(path)
    await worker.release_stale_mounts()
    server = grpc.aio.server(options=[(MAX_CONNECTIONS_OPTION, max_clients)])
    server.add_generic_rpc_handlers((handler(worker),))
    reflection.register(server, SERVICE.full_name)  # as upstream's worker: grpcurl works
    try:
        with _socketfile.private_umask():
            server.add_insecure_port(f"unix:{path}")
            await server.start()
    except RuntimeError as e:
        raise exceptions.ConfigError(
            f"while serving the worker API on {path}: {e}; choose another --worker-socket"
        ) from e
    ours = path.stat()
    try:
        # Closed before the server stops: a call still in it is answered, not cut off.
        with worker.hosted_in(tasks):
            yield
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop(grace=1.0)
        _socketfile.unlink_if_ours(path, ours)


async def watch_connections(
    path: Path,
    max_clients: int,
    *,
    interval: float = WATCH_INTERVAL,
    stalled_after: float = STALLED_AFTER,
) -> None:
    """Say what gRPC core does not about the worker socket (until cancelled).

    Every ``interval`` seconds the kernel's count (:func:`_socketfile.connections`) is read:

    - **full**: ``max_clients`` connections held, so gRPC core closes each new one without a
      word: a warning when it fills, a line when it has room again;
    - **not accepting**: connections have waited in the backlog for ``stalled_after``
      seconds. gRPC core retries an accept that met EMFILE a second later, but closes its
      acceptor for good on any other accept error (ENFILE: the system's file table is
      full; ENOBUFS, ENOMEM): the socket then never answers again. An error says so, and a
      line when the backlog drains.

    The kernel's table is opened once and read again each time, so counting needs no
    descriptor while the process has none to spare; while it cannot be opened (or read),
    counts are skipped.
    """
    full = stalled = False
    waiting_since: float | None = None
    table: BinaryIO | None = None
    try:
        while True:
            try:
                if table is None:
                    table = _socketfile.UNIX_SOCKETS.open("rb")
                now = await anyio.to_thread.run_sync(_socketfile.read_connections, table, path)
            except OSError as e:
                log.debug("worker socket connections not counted", error=str(e))
                await anyio.sleep(interval)
                continue
            if now.held >= max_clients and not full:
                log.warning(
                    "worker socket full: further connections are closed as they are accepted",
                    worker_socket=str(path),
                    connections=now.held,
                    max_worker_clients=max_clients,
                )
            elif now.held < max_clients and full:
                log.info(
                    "worker socket has room again", worker_socket=str(path), connections=now.held
                )
            full = now.held >= max_clients
            if not now.waiting:
                if stalled:
                    log.info("worker socket accepting again", worker_socket=str(path))
                stalled, waiting_since = False, None
            elif waiting_since is None:
                waiting_since = time.monotonic()
            elif not stalled and time.monotonic() - waiting_since >= stalled_after:
                stalled = True
                log.error(
                    "worker socket not accepting: connections wait in its backlog; the agent is "
                    "out of descriptors, or gRPC core closed its acceptor after an accept error "
                    "(ENFILE, ENOMEM): restart the agent if it lasts",
                    worker_socket=str(path),
                    waiting=now.waiting,
                    seconds=round(time.monotonic() - waiting_since, 1),
                )
            await anyio.sleep(interval)
    finally:
        if table is not None:
            table.close()
