"""The lifecycle's vocabulary as typed names: states, triggers and effects.

``machines/actor.yaml`` is the machine; these enums let code name its parts without string
typos. They are not a second source of truth: :func:`substrate_gpu.lifecycle.machine.load_spec`
checks them against the YAML (and :data:`State` against its states, :data:`Trigger` against
its triggers and the event types, :data:`Effect` against the effects its states start and
the effect registry) and refuses to load on any difference, naming what is missing on
which side. Adding a state to the YAML therefore fails loudly until it is named here too.
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


class Trigger(StrEnum):
    """A trigger of ``machines/actor.yaml``: also the ``type`` of one event class."""

    # external events (the node agent submits them)
    ACTOR_REGISTERED = "actor_registered"
    BUNDLE_PREPARED = "bundle_prepared"
    RUN_REQUESTED = "run_requested"
    SUSPEND_REQUESTED = "suspend_requested"
    RESTORE_REQUESTED = "restore_requested"
    RETRY_REQUESTED = "retry_requested"
    DELETE_REQUESTED = "delete_requested"
    CUDA_CONTEXT_OPENED = "cuda_context_opened"
    CUDA_CONTEXT_CLOSED = "cuda_context_closed"
    SANDBOX_EXITED = "sandbox_exited"
    # outcomes (the effects produce them)
    GPUS_ALLOCATED = "gpus_allocated"
    GPUS_UNAVAILABLE = "gpus_unavailable"
    GPUS_REFUSED = "gpus_refused"
    GPUS_FREED = "gpus_freed"
    GPU_INJECTED = "gpu_injected"
    INJECTION_FAILED = "injection_failed"
    SANDBOX_CREATED = "sandbox_created"
    SANDBOX_STARTED = "sandbox_started"
    CHECKPOINT_WRITTEN = "checkpoint_written"
    CHECKPOINT_REFUSED = "checkpoint_refused"
    CHECKPOINT_FAILED = "checkpoint_failed"
    RESTORED = "restored"
    RESTORE_FAILED = "restore_failed"
    EFFECT_FAILED = "effect_failed"
    EFFECT_TIMED_OUT = "effect_timed_out"
    DELETED = "deleted"
    NO_LIVE_CONTEXT = "no_live_context"
    LIVE_CONTEXT_FOUND = "live_context_found"
    CUDA_SUSPENDED = "cuda_suspended"
    CUDA_SUSPEND_REFUSED = "cuda_suspend_refused"
    CUDA_SUSPEND_FAILED = "cuda_suspend_failed"
    CUDA_RESUMED = "cuda_resumed"
    CUDA_RESUME_FAILED = "cuda_resume_failed"
    PREFLIGHT_REFUSED = "preflight_refused"
    RESTORE_REFUSED = "restore_refused"
    GPUS_VERIFIED = "gpus_verified"
    GPU_VERIFICATION_FAILED = "gpu_verification_failed"


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
