"""The door: events in, answers out, whatever the transport (:class:`AgentService`).

Both doors give events to the agent through here: the JSON lines of the socket and stdin
(:mod:`.lines`) and the worker API (:mod:`.worker_api`). Design decisions:

- **Nothing malformed reaches the log.** A line is parsed and checked
  (:func:`protocol.parse_request`) before ``Agent.submit``; the machine refuses invalid
  events before the recorder is called. Only accepted events are recorded.
- **The acknowledgement follows durability.** ``submit`` returns after the event log has
  fsynced the event (the recorder is awaited before the effect starts), so an ``ok`` line
  means the event survives a crash.
- **Every line gets an answer; no line ends the process.** Decoding a line is wrapped in a
  per-line boundary (:meth:`AgentService.handle_line`): whatever the decoder raises becomes
  a ``malformed`` answer for that line.
- **A failed event log stops acknowledgements, not the process.** Once the log fails (a
  write error, a full disk, the log's file no longer at its path), every later line is
  answered ``unavailable`` with the cause, ``substrate_gpu_event_log_usable`` drops to 0 and
  the failure is logged once: memory and log may disagree, so nothing more is accepted until
  an operator fixes the log and restarts the agent. Staying up keeps the reason visible to
  clients and to Prometheus (an exit would let a supervisor restart it onto an empty log).
- **A line already read is answered through shutdown** (:meth:`AgentService.answering`),
  within the grace :meth:`AgentService.begin_shutdown` gives it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from substrate_gpu import eventlog
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import Agent, errors, events, hooks
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.service import protocol, query, wiring

if TYPE_CHECKING:
    pass

log = get_logger(__name__)


class AgentService:
    """Turns request lines into submitted events and response lines (transport-free)."""

    def __init__(self, agent: Agent, metrics: AgentMetrics | None = None) -> None:
        self.agent = agent
        self.metrics = metrics
        """Where refusals, connections and a failed log are counted (None: nowhere)."""
        self.log_failure: str | None = None
        """Why the event log failed (set once; every later line is answered unavailable)."""
        self._answering: set[anyio.CancelScope] = set()
        self._grace_deadline: float | None = None

    async def answer(self, event: events.Event, line_number: int = 0) -> bytes:
        """Offer ``event``; the response line (an ack, the machine's refusal, unavailable)."""
        accepted = await self.offer(event)
        if isinstance(accepted, protocol.RequestError):
            return self.reject(accepted, line_number)
        return protocol.ack(wiring.SeqTap.seq_of_last_submit(), accepted)

    async def offer(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        """Offer ``event`` to the agent: the transition it caused, or why it was not
        accepted (the machine's refusal, or unavailable once the log failed), as a value,
        never raised. Both doors (JSON lines, the worker API) offer through here; the caller
        counts a refusal (:meth:`reject`)."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            return await self.agent.submit(event)
        except errors.InvalidEvent as e:
            return protocol.classify_refusal(e, self.agent.spec)
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))

    async def offer_all(
        self, group: Sequence[events.Event]
    ) -> list[hooks.Transition] | protocol.RequestError:
        """:meth:`offer` of several events in order, durable together (one fsync): their
        transitions, or why one was not accepted (those before it stay accepted)."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            return await self.agent.submit_all(group)
        except errors.InvalidEvent as e:
            return protocol.classify_refusal(e, self.agent.spec)
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))

    async def durable(self) -> protocol.RequestError | None:
        """Wait until every accepted event is durable (a door does before it answers for
        one); why not, once the log failed."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            await self.agent.durable()
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))
        return None

    async def handle_line(self, line: bytes, line_number: int) -> bytes | None:
        """The response to one request line; None for a blank line (ignored). Never raises
        for anything in the line."""
        if not line.strip():
            return None
        if len(line) > protocol.MAX_LINE_BYTES:
            return self.reject(too_long(), line_number)
        if query.is_query(line):
            return query.answer(self.agent, line, line_number)
        try:
            parsed = protocol.parse_request(line)
        except Exception as e:  # noqa: BLE001 (the per-line boundary: see the module doc)
            log.warning("request decoder raised", line=line_number, error=repr(e)[:200])
            parsed = protocol.RequestError(
                "malformed", f"request could not be decoded ({type(e).__name__})"
            )
        if isinstance(parsed, protocol.RequestError):
            return self.reject(parsed, line_number)
        return await self.answer(parsed, line_number)

    def _log_failed(self, error: BaseException) -> None:
        """Stop acknowledging for good: the log (or the agent's recorder) failed."""
        cause = error.__cause__ if isinstance(error, errors.AgentClosedError) else error
        if not isinstance(cause, eventlog.EventLogError):
            # Closed for another reason (shutting down): nothing to mark.
            return
        if self.log_failure is None:
            self.log_failure = str(cause)
            log.error("event log failed: acknowledging nothing more", error=str(cause))
            if self.metrics is not None:
                self.metrics.event_log_failed()

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        """Count and log a refused request; its response line."""
        if self.metrics is not None:
            self.metrics.event_rejected(protocol.REJECTION_REASONS.get(error.kind, "malformed"))
        log.info("request refused", kind=error.kind, line=line_number, error=error.message)
        return protocol.refusal(error, line_number)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Shield the handling of a line already read from the intake's cancellation.

        Once shutdown begins (:meth:`begin_shutdown`) the shield has a deadline, so a submit
        waiting for a queue slot cannot hold the process beyond the grace period.
        """
        with anyio.CancelScope(shield=True) as scope:
            if self._grace_deadline is not None:
                scope.deadline = self._grace_deadline
            self._answering.add(scope)
            try:
                yield
            finally:
                self._answering.discard(scope)

    def begin_shutdown(self, grace: float) -> None:
        """Give lines being answered ``grace`` seconds more, then cancel them."""
        self._grace_deadline = anyio.current_time() + grace
        for scope in self._answering:
            scope.deadline = min(scope.deadline, self._grace_deadline)


def too_long() -> protocol.RequestError:
    """The error for a request line over :data:`protocol.MAX_LINE_BYTES`."""
    return protocol.RequestError(
        "too_long",
        f"request line exceeds {protocol.MAX_LINE_BYTES} bytes (the newline not counted)",
    )


def unavailable(cause: str) -> protocol.RequestError:
    """The error for any request once the event log failed."""
    return protocol.RequestError(
        "unavailable",
        f"the agent acknowledges nothing more: {cause}; the operator must fix the event log "
        "and restart the agent",
    )
