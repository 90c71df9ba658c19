"""Telling the node's atelet what this worker can host: ``atelet.WorkerSupport/RegisterWorker``.

Upstream's worker reports its capacity at start (``ateom.Report``, agent-substrate 533900d),
and nothing else tells the control plane, which places no actor on a worker until the report
lands. The agent does the same when it serves the worker API, as a background task that
never stops it from serving:

- **What is sent** (:func:`register_request`): ``capacity.actors`` = ``--max-actors``;
  ``capacity.resources.limits`` = the container's CPU and memory limits read once from the
  downward-API files ``<--capacity-dir>/cpu_milli`` and ``memory_bytes``, as Kubernetes
  quantities (``1500m``, ``2Gi``) — a missing or unusable file is 0 with a warning, and a 0
  is left out, which the control plane reads as none (better to place nothing than to invent
  a number); ``hardware.attributes`` = ``{"architecture": <GOARCH>}``, what upstream's
  ``hardware.ProbeHost`` reports.
- **How** (:mod:`.atelet_dial`): mTLS over atelet's Unix socket with the worker's Pod
  certificate, accepting only this node's atelet, the call carried by :mod:`.grpc_h2`.
- **Retries** as upstream: every failed attempt (no socket yet, a refused or wrong peer, any
  status atelet answers, 10 s passing) is retried after 0.5 s, doubling to 30 s, until
  atelet accepts (it accepts once the control plane recorded the report); the report is sent
  once, not re-asserted. What no retry can change — a flag left empty, a credential or trust
  bundle that cannot be used at start, a certificate without a Pod identity — stops the
  report for good (upstream's worker exits on those; the agent keeps serving and says so).

:class:`Registration` is where the task's state is read (``substrate_gpu_atelet_registration``,
the logs).
"""

from __future__ import annotations

import enum
import re
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
from google.protobuf import json_format

from substrate_gpu import _defaults, preflight
from substrate_gpu._log import get_logger
from substrate_gpu.service import atelet_dial, grpc_h2
from substrate_gpu.service.atelet import atelet_pb2 as pb
from substrate_gpu.service.config import AgentConfig

log = get_logger(__name__)

__all__ = [
    "CALL_TIMEOUT",
    "INITIAL_BACKOFF",
    "MAX_BACKOFF",
    "REGISTER_WORKER",
    "Registration",
    "RegistrationState",
    "ReportConfig",
    "backoffs",
    "binary_quantity",
    "milli_quantity",
    "read_capacity",
    "read_limit",
    "register_request",
    "report",
]

CALL_TIMEOUT: Final = 10.0
"""Seconds one attempt (connect, handshake, call) may take."""
INITIAL_BACKOFF: Final = 0.5
"""Seconds before the first retry; each later one waits twice as long, up to :data:`MAX_BACKOFF`."""
MAX_BACKOFF: Final = 30.0

_SERVICE: Final = pb.DESCRIPTOR.services_by_name["WorkerSupport"]
REGISTER_WORKER: Final = f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name['RegisterWorker'].name}"
"""The method's HTTP/2 path, from our .proto: ``/atelet.WorkerSupport/RegisterWorker``."""

ARCHITECTURE: Final = "architecture"
"""The hardware attribute upstream's worker reports (Go's ``runtime.GOARCH``)."""


# --- what is sent: pure ---------------------------------------------------------------------


def _strip_factors(value: int, base: int) -> tuple[int, int]:
    """``value`` without its factors of ``base``, and how many there were (0 stays 0)."""
    times = 0
    while value and value % base == 0:
        value //= base
        times += 1
    return value, times


_DECIMAL_SUFFIXES: Final = {
    -9: "n",
    -6: "u",
    -3: "m",
    0: "",
    3: "k",
    6: "M",
    9: "G",
    12: "T",
    15: "P",
    18: "E",
}
_BINARY_SUFFIXES: Final = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def _decimal(mantissa: int, exponent: int) -> str:
    """Kubernetes' canonical DecimalSI form of ``mantissa``x10^``exponent``."""
    if mantissa == 0:
        return "0"
    amount, times = _strip_factors(mantissa, 10)
    exponent += times
    # An exponent that is a multiple of 3 names a suffix; move the rest into the amount.
    shift = exponent % 3
    amount *= 10**shift
    exponent -= shift
    return f"{amount}{_DECIMAL_SUFFIXES[exponent]}"


def milli_quantity(milli: int) -> str:
    """``resource.NewMilliQuantity(milli, DecimalSI).String()``: 1500 ``1500m``, 2000 ``2``."""
    return _decimal(milli, -3)


def binary_quantity(count: int) -> str:
    """``resource.NewQuantity(count, BinarySI).String()``: 2147483648 -> ``2Gi``; a count
    that 1024 does not divide is written whole (``1000000000``), one under 1024 as DecimalSI."""
    if -1024 < count < 1024:
        return _decimal(count, 0)
    amount, times = _strip_factors(count, 1024)
    return f"{amount}{_BINARY_SUFFIXES[times]}"


def register_request(
    *, actors: int, cpu_milli: int, memory_bytes: int, architecture: str
) -> pb.RegisterWorkerRequest:
    """The report: a limit read as 0 is left out; no limits at all, no ``resources``."""
    limits = []
    if cpu_milli:
        limits.append(pb.Limits(name="cpu", quantity=milli_quantity(cpu_milli)))
    if memory_bytes:
        limits.append(pb.Limits(name="memory", quantity=binary_quantity(memory_bytes)))
    capacity = pb.WorkerResources(actors=actors)
    if limits:
        capacity.resources.CopyFrom(pb.Resources(limits=limits))
    return pb.RegisterWorkerRequest(
        capacity=capacity, hardware=pb.HardwareIdentity(attributes={ARCHITECTURE: architecture})
    )


def backoffs(initial: float = INITIAL_BACKOFF, ceiling: float = MAX_BACKOFF) -> Iterator[float]:
    """The waits between attempts: ``initial``, doubling, at most ``ceiling``, for ever."""
    delay = initial
    while True:
        yield delay
        delay = min(delay * 2, ceiling)


# --- what is read: the capacity files -----------------------------------------------------------


_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
"""What Go's ``strconv.ParseInt(s, 10, 64)`` reads (no underscores, ASCII digits)."""


def read_limit(path: Path) -> int:
    """A downward-API limit file's value; 0 (with a warning) when missing or unusable."""
    try:
        raw = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        log.warning("ignoring unreadable capacity limit", path=str(path), error=str(e))
        return 0
    value = int(raw) if _INTEGER.fullmatch(raw) else -1
    if not 0 <= value < 1 << 63:
        log.warning("ignoring unusable capacity limit", path=str(path), value=raw[:64])
        return 0
    return value


def read_capacity(directory: Path) -> tuple[int, int]:
    """``(cpu_milli, memory_bytes)`` from ``directory``'s downward-API files."""
    return (
        read_limit(directory / _defaults.CPU_LIMIT_FILE),
        read_limit(directory / _defaults.MEMORY_LIMIT_FILE),
    )


# --- the task -----------------------------------------------------------------------------


class RegistrationState(enum.StrEnum):
    """Where the capacity report stands (the ``state`` of ``substrate_gpu_atelet_registration``)."""

    OFF = "off"
    """Not reported: the worker API is not served, or ``--atelet-socket ''``."""
    REPORTING = "reporting"
    """Sent, not accepted yet: retrying (atelet absent, refused, answering an error)."""
    REGISTERED = "registered"
    """atelet accepted the report: the control plane may place actors here."""
    STOPPED = "stopped"
    """Given up: a misconfiguration no retry changes (the detail says which)."""


@dataclass
class Registration:
    """The report's state, for metrics and logs; ``on_change`` hears every state entered."""

    state: RegistrationState = RegistrationState.OFF
    detail: str = "not reported"
    attempts: int = 0
    on_change: Callable[[RegistrationState], None] | None = None

    def enter(self, state: RegistrationState, detail: str) -> None:
        """Move to ``state``, saying why."""
        changed = state is not self.state
        self.state, self.detail = state, detail
        if changed and self.on_change is not None:
            self.on_change(state)


@dataclass(frozen=True)
class ReportConfig:
    """What the report needs (the agent's flags)."""

    socket: Path = _defaults.WORKER_SUPPORT_SOCKET
    """atelet's worker-support socket (``--atelet-socket``)."""
    credential_bundle: Path = _defaults.CREDENTIAL_BUNDLE
    """The worker's Pod credential bundle (``--atunnel-credential-bundle``)."""
    trust_bundle: Path = _defaults.TRUST_BUNDLE
    """The Pod identity signer's trust bundle (``--atunnel-trust-bundle``)."""
    atelet_spiffe_id: str = _defaults.ATELET_SPIFFE_ID
    """The identity atelet must present (``--atunnel-broker-identity``)."""
    actors: int = _defaults.MAX_ACTORS
    """Actors this worker hosts at once (``--max-actors``)."""
    capacity_dir: Path = _defaults.CAPACITY_DIR
    """The downward-API capacity files (``--capacity-dir``)."""

    @classmethod
    def of(cls, config: AgentConfig, socket: Path) -> ReportConfig:
        """What ``config`` sets, reporting to ``socket``."""
        return cls(
            socket=socket,
            credential_bundle=config.credential_bundle,
            trust_bundle=config.trust_bundle,
            atelet_spiffe_id=config.atelet_spiffe_id,
            actors=config.max_actors,
            capacity_dir=config.capacity_dir,
        )


async def report(
    config: ReportConfig,
    registration: Registration,
    *,
    initial_backoff: float = INITIAL_BACKOFF,
    call_timeout: float = CALL_TIMEOUT,
) -> None:
    """Report until atelet accepts, or until a misconfiguration stops it; never raises
    (but is cancellable: the agent cancels it when it stops). ``initial_backoff`` and
    ``call_timeout`` are upstream's unless a test shortens them."""
    try:
        dialer = atelet_dial.AteletDialer(
            config.socket, config.credential_bundle, config.trust_bundle, config.atelet_spiffe_id
        )
    except atelet_dial.CredentialError as e:
        registration.enter(RegistrationState.STOPPED, str(e))
        # A misconfiguration, not a crash: no traceback.
        log.error("worker capacity report stopped: it cannot be sent", error=str(e))  # noqa: TRY400
        return
    cpu_milli, memory_bytes = read_capacity(config.capacity_dir)
    request = register_request(
        actors=config.actors,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        architecture=preflight.host_architecture(),
    )
    summary = json_format.MessageToDict(request)
    registration.enter(RegistrationState.REPORTING, f"reporting to {config.socket}")
    payload = request.SerializeToString()
    for delay in backoffs(initial_backoff):
        registration.attempts += 1
        try:
            with anyio.fail_after(call_timeout):
                await dialer.call(REGISTER_WORKER, payload, timeout=call_timeout)
        except TimeoutError:
            error = f"no answer within {call_timeout:g} s"
        except (
            OSError,
            atelet_dial.AteletRefused,
            atelet_dial.CredentialError,
            grpc_h2.GrpcError,
            anyio.BrokenResourceError,
            anyio.EndOfStream,
        ) as e:
            error = _cause(e)
        except Exception as e:  # the report never stops the agent: retried
            log.exception("worker capacity report failed unexpectedly")
            error = f"unexpected {type(e).__name__}: {e}"
        else:
            registration.enter(
                RegistrationState.REGISTERED, f"accepted by atelet at {config.socket}"
            )
            log.info(
                "registered worker capacity and hardware",
                socket=str(config.socket),
                attempts=registration.attempts,
                **summary,
            )
            return
        registration.enter(RegistrationState.REPORTING, f"retrying in {delay:g} s: {error}")
        log.warning(
            "retrying worker capacity report",
            retry_in=delay,
            socket=str(config.socket),
            attempt=registration.attempts,
            error=error,
        )
        await anyio.sleep(delay)


def _cause(error: BaseException) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"atelet's certificate was refused: {error.verify_message or error}"
    if isinstance(error, ssl.SSLError):
        return f"the TLS handshake with atelet failed: {error.reason or error}"
    if isinstance(error, OSError):
        return f"cannot connect to atelet's socket: {error.strerror or error}"
    return str(error) or type(error).__name__
