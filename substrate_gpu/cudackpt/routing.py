"""Choosing how to suspend a GPU actor that holds a live CUDA context.

Three routes, in order of preference:

- ``runsc-cuda-checkpoint`` — runsc supports ``checkpoint --cuda-checkpoint-path`` and
  drives cuda-checkpoint itself (one command; runsc knows its own processes best).
- ``exec-cuda-checkpoint`` — ``cuda-checkpoint`` runs inside the sandbox: we lock and
  checkpoint each CUDA process through ``runsc exec`` before ``runsc checkpoint``, and
  restore and unlock after ``runsc restore`` (or after a failed checkpoint).
- ``refuse`` — neither exists, or the pool's policy says so: the suspend is refused as an
  explicit transition and the actor keeps running (gVisor cannot save a live context).

A pure function of facts found elsewhere (runsc's features, an exec probe) and the pool's
policy, so the decision is testable as a table and recorded with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from substrate_gpu.runsc import api as runsc_api

#: How a live CUDA context is handled on suspend.
RouteName = Literal["runsc-cuda-checkpoint", "exec-cuda-checkpoint", "refuse"]

#: The pool's say: ``auto`` takes the best route available, ``refuse`` always refuses
#: (the upstream behaviour: suspend GPU actors only between CUDA workloads).
SuspendPolicy = Literal["auto", "refuse"]

SUSPEND_POLICIES: tuple[SuspendPolicy, ...] = ("auto", "refuse")


@dataclass(frozen=True)
class Route:
    """The chosen route and why."""

    name: RouteName
    """What to do."""
    reason: str
    """Why, in words fit for a log line and a refusal message."""

    @property
    def refuses(self) -> bool:
        """The suspend of an actor with a live context is refused."""
        return self.name == "refuse"


def choose_suspend_route(
    features: runsc_api.RunscFeatures,
    cuda_checkpoint_available: bool,
    policy: SuspendPolicy = "auto",
) -> Route:
    """The route for suspending an actor whose sandbox holds a live CUDA context."""
    if policy not in SUSPEND_POLICIES:
        raise ValueError(
            f"unknown GPU suspend policy {policy!r} (expected one of {SUSPEND_POLICIES})"
        )
    if policy == "refuse":
        return Route("refuse", "the pool's GPU suspend policy is 'refuse'")
    if features.cuda_checkpoint_path:
        return Route("runsc-cuda-checkpoint", "runsc supports checkpoint --cuda-checkpoint-path")
    if cuda_checkpoint_available:
        return Route(
            "exec-cuda-checkpoint",
            "cuda-checkpoint runs inside the sandbox; runsc has no --cuda-checkpoint-path",
        )
    # The runsc build is not named: its version is said once, where the agent starts, and a
    # reason repeated on every refusal should not name a second one (a demo runs two).
    return Route(
        "refuse",
        "runsc has no checkpoint --cuda-checkpoint-path and cuda-checkpoint is not available "
        "inside the sandbox",
    )
