"""The lifecycle's vocabulary as typed names: states and effects.

``machines/actor.yaml`` is the machine; these enums let code name its parts without string
typos. They are not a second source of truth: :func:`substrate_gpu.lifecycle.machine.load_spec`
checks them against the YAML (:data:`State` against its states, :data:`Effect` against the
effects its states start and the effect registry) and refuses to load on any difference,
naming what is missing on which side. Adding a state to the YAML therefore fails loudly
until it is named here too.

A trigger needs no name here: each is the ``type`` of one event class
(:mod:`substrate_gpu.lifecycle.events`), which code names instead (``events.Deleted.type``);
``load_spec`` checks every trigger is an event type and every event type a trigger.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """A state of ``machines/actor.yaml`` (its ``states`` list)."""

    NEW = "new"
    REGISTERED = "registered"
    BUNDLE_PREPARED = "bundle_prepared"
    ALLOCATING = "allocating"
    AWAITING_GPUS = "awaiting_gpus"
    INJECTING = "injecting"
    CREATING = "creating"
    STARTING = "starting"
    VERIFYING = "verifying"
    RUNNING = "running"
    PROBING = "probing"
    CUDA_SUSPENDING = "cuda_suspending"
    CHECKPOINTING = "checkpointing"
    CUDA_RESUMING = "cuda_resuming"
    SUSPENDED = "suspended"
    RESTORING = "restoring"
    STOPPED = "stopped"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"


class Effect(StrEnum):
    """An effect an in-flight state starts (a state's ``effect`` in the YAML)."""

    ALLOCATE = "allocate"
    INJECT = "inject"
    CREATE = "create"
    START = "start"
    VERIFY = "verify"
    PROBE = "probe"
    CUDA_SUSPEND = "cuda_suspend"
    CHECKPOINT = "checkpoint"
    CUDA_RESUME = "cuda_resume"
    RESTORE = "restore"
    DELETE = "delete"
