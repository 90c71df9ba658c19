"""Errors of the actor lifecycle, all under :class:`~substrate_gpu.exceptions.SubstrateGpuError`.

Kept beside the lifecycle so it can change without touching the other layers; each is
re-exported from :mod:`substrate_gpu.lifecycle`.
"""

from __future__ import annotations

from substrate_gpu import exceptions


class MachineDefinitionError(exceptions.ConfigError):
    """The lifecycle YAML is invalid: the message names the file and the offending entry."""


class EventSchemaError(exceptions.SubstrateGpuError):
    """An event's JSON form is malformed, of an unknown type, or of an unknown version."""


class EventFieldError(EventSchemaError, ValueError):
    """An event's fields break a rule the types cannot state (checked in ``__post_init__``).

    ``field`` is the offending key's path below the event (``gpu_names[1]``). A ValueError
    too: msgspec reports one raised while decoding as a validation error at the event's
    path (not a traceback through the decoder), and the codec names the field from both.
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidEvent(exceptions.SubstrateGpuError):
    """An event is not accepted in the actor's current state; the actor is left unchanged.

    ``actor_id``, ``state`` and ``event_type`` say which actor, where it stood, and what was
    refused; ``problem`` says why.
    """

    def __init__(self, actor_id: str, state: str, event_type: str, problem: str) -> None:
        self.actor_id = actor_id
        self.state = state
        self.event_type = event_type
        self.problem = problem
        super().__init__(
            f"actor {actor_id!r} in state {state!r} refused event {event_type!r}: {problem}"
        )


class LoggedEventRefused(InvalidEvent):
    """An event read back from the log is refused now (replay): ``record`` is that event,
    so the caller can name its line."""

    def __init__(self, record: object, refused: InvalidEvent) -> None:
        super().__init__(refused.actor_id, refused.state, refused.event_type, refused.problem)
        self.record = record


class AgentClosedError(exceptions.SubstrateGpuError):
    """The agent is not serving (not entered yet, closed, or stopped by a recorder failure)."""


class StateWaitTimeout(exceptions.SubstrateGpuError, TimeoutError):
    """``wait_for_state`` gave up: the actor did not reach the state in time."""


class StateUnreachable(StateWaitTimeout):
    """``wait_for_state`` stopped early: the actor cannot reach the state by itself any more
    (a final state, or at rest after a failure or refusal; the message has its reason).

    A :class:`StateWaitTimeout` too, so code that handles the wait running out handles this
    earlier end of it the same way."""


class SubscriptionOverflow(exceptions.SubstrateGpuError):
    """A transition subscriber fell behind its buffer and was disconnected (it missed some)."""


class AllocationError(exceptions.SubstrateGpuError):
    """A GPU allocation would share a GPU between actors or name one the worker lacks."""
