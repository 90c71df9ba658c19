"""Actor records: one small ``__slots__`` :class:`Actor` per actor, its frozen
:class:`ActorView`, and the conditions and callbacks ``machines/actor.yaml`` names.

The conditions and callbacks the YAML names are :class:`Actor` methods taking the event
(conditions return bool and only read; callbacks return None). The table that moves actors
through the machine, one interpreter for every actor, is :mod:`.table`.

**CUDA contexts** are identified by the pid holding them (CUDA gives a process one primary
context per device, and the node agent observes contexts per process): opening a pid's
context twice is one context, closing it once closes it. An event without a pid (``pid``
0: the sender does not know it) is one anonymous context each, as before pids existed.

Actors never compare equal to each other by value (plain class, identity equality), so
transitions can never merge them.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from substrate_gpu.lifecycle import events


def _pid_set(text: str) -> set[int]:
    return {int(p) for p in text.split(",") if p} if text else set()


def _pid_text(pids: Iterable[int]) -> str:
    return ",".join(str(p) for p in sorted(pids))


class Actor:
    """One actor's lifecycle record: the state plus what its effects need."""

    #: The fields an :class:`ActorView` copies (the actor's persistent state).
    FIELDS = (
        "actor_id",
        "state",
        "gpu",
        "bundle",
        "checkpoint",
        "live_contexts",
        "sandbox",
        "reason",
        "exited",
        "suspend_policy",
        "suspend_route",
        "cuda_pids",
        "checkpoint_cuda_pids",
        "context_pids",
        "gpus",
        "gpu_names",
        "gpu_devices",
        "gpu_next",
        "uses_allocator",
        "containers",
        "identity",
        "checkpoint_target",
        "container_gpus",
        "runsc",
    )
    __slots__ = (*FIELDS, "entered_by", "refusal", "transition_reason")

    def __init__(self, actor_id: str, state: str) -> None:
        self.actor_id = actor_id
        """The actor id (also its sandbox container id)."""
        self.state = state
        """The machine state name."""
        self.gpu = False
        """GPUs are injected and nvproxy is used."""
        self.bundle = ""
        """The OCI bundle directory."""
        self.checkpoint: str | None = None
        """The last good checkpoint image directory."""
        self.live_contexts = 0
        """CUDA contexts observed open: one per pid in ``context_pids``, plus pid-less ones."""
        self.context_pids = ""
        """Pids holding an observed open CUDA context, comma-separated, ascending."""
        self.sandbox = False
        """A sandbox (container) may exist in the runtime and must be deleted before reuse."""
        self.reason: str | None = None
        """Why the actor is failed/stopped, or the last refusal."""
        self.exited = False
        """The sandbox was reported exited while an effect was in flight."""
        self.suspend_policy = "auto"
        """The pool's GPU suspend policy (``auto`` or ``refuse``)."""
        self.suspend_route = ""
        """How the current (or last) suspend handles a live CUDA context, or empty."""
        self.cuda_pids = ""
        """Sandbox pids whose CUDA state is checkpointed now (to resume), comma-separated."""
        self.checkpoint_cuda_pids = ""
        """Pids whose CUDA state the last good checkpoint holds (exec route): every restore
        of that checkpoint resumes them."""
        self.gpus = 0
        """GPUs asked for by count (0: by ``gpu_names``, else all of the worker's)."""
        self.gpu_names = ""
        """GPUs asked for by qualified CDI name, comma-separated (CDI names have no comma)."""
        self.gpu_devices = ""
        """The GPUs last allocated, comma-separated (held while the state ``holds_gpus``)."""
        self.gpu_next = ""
        """Where ``allocating`` leads once GPUs are granted: ``run`` or ``restore``."""
        self.uses_allocator = False
        """GPUs come from the worker's allocator (registered by ``actor_registered`` v2+;
        a v1 registration, from a log older than allocation, got all GPUs unallocated)."""
        self.containers: tuple[str, ...] = ()
        """A sandbox actor's app containers, in order (``_pause`` implied); empty: one
        container whose id is the actor id."""
        self.identity: dict[str, str] = {}
        """The registration's opaque identity (never mutated: replaced whole)."""
        self.checkpoint_target = ""
        """Where the current suspend writes its checkpoint (``suspend_requested``'s
        ``image_path``), or empty: ``<checkpoint_root>/<actor>/<seq>``."""
        self.container_gpus: dict[str, str] = {}
        """A sandbox's app container -> the GPUs its own config asked for, comma-separated
        (``actor_registered`` v4); empty: every app container gets the actor's GPUs. Never
        mutated: replaced whole."""
        self.runsc = ""
        """The runsc binary a sandbox runs under (``actor_registered`` v4); empty: the
        agent's own."""
        self.refusal: str | None = None
        """Set by the applied transition: the bounded refusal reason, if it is one."""
        self.transition_reason: str | None = None
        """Set by the applied transition: why, for failures and refusals."""
        self.entered_by: events.Event | None = None
        """The logged event that entered the current state, as replay saw it
        (:meth:`ActorTable.apply_logged`; recovery needs it for in-flight states). The live
        agent does not keep it: its pipeline holds the event it acts on."""

    def snapshot(self) -> ActorView:
        """An immutable copy, handed to effects and callers."""
        return ActorView(*read_fields(self))  # type: ignore[arg-type]

    def load(self, view: ActorView) -> None:
        """Take every field of ``view`` (recovery from a snapshot)."""
        for name in Actor.FIELDS:
            setattr(self, name, getattr(view, name))

    def __repr__(self) -> str:
        return f"Actor({self.actor_id!r}, state={self.state!r}, reason={self.reason!r})"

    # --- conditions (named by the YAML; they read, never write) ----------------------------

    def is_gpu(self, event: events.Event) -> bool:
        """The actor uses GPUs."""
        return self.gpu

    def has_live_context(self, event: events.Event) -> bool:
        """At least one CUDA context is observed open."""
        return self.live_contexts > 0

    def sandbox_survived(self, event: events.Event) -> bool:
        """The failed/refused checkpoint left the sandbox running."""
        return bool(getattr(event, "sandbox_survived", False))

    def has_exited(self, event: events.Event) -> bool:
        """The sandbox exited while the current effect was in flight."""
        return self.exited

    def has_checkpoint(self, event: events.Event) -> bool:
        """A checkpoint to restore is known (the event's, or the actor's last good one)."""
        return bool(getattr(event, "image_path", None) or self.checkpoint)

    def refuses_gpu_suspend(self, event: events.Event) -> bool:
        """The pool's GPU suspend policy is ``refuse``."""
        return self.suspend_policy == "refuse"

    def route_is_runsc(self, event: events.Event) -> bool:
        """The live context is suspended by runsc itself (``--cuda-checkpoint-path``)."""
        return getattr(event, "route", None) == events.ROUTE_RUNSC

    def route_is_exec(self, event: events.Event) -> bool:
        """The live context is suspended by cuda-checkpoint exec'd in the sandbox."""
        return getattr(event, "route", None) == events.ROUTE_EXEC

    def suspended_cuda_in_sandbox(self, event: events.Event) -> bool:
        """This suspend checkpointed CUDA processes through the sandbox (exec route): a
        failed checkpoint must resume them."""
        return self.suspend_route == events.ROUTE_EXEC

    def image_has_exec_cuda_state(self, event: events.Event) -> bool:
        """The restored image holds CUDA state checkpointed through the sandbox."""
        return getattr(event, "cuda_route", "") == events.ROUTE_EXEC

    def allocates_gpus(self, event: events.Event) -> bool:
        """A GPU actor whose GPUs come from the allocator (not a v1 registration)."""
        return self.gpu and self.uses_allocator

    def verifies_gpus(self, event: events.Event) -> bool:
        """A GPU actor's sandbox is checked before it runs (``verifying``): the event was
        written by an agent that verifies (v2 and later; a v1 line replays as it ran, straight
        to ``running``)."""
        return self.gpu and event.v >= 2

    def allocated_for_restore(self, event: events.Event) -> bool:
        """The GPUs being allocated are for a restore (not a run from the bundle)."""
        return self.gpu_next == "restore"

    def context_is_open(self, event: events.Event) -> bool:
        """The event's context is open: its pid's, or else a pid-less one."""
        pid = getattr(event, "pid", 0)
        text = self.context_pids
        if not text:
            return self.live_contexts > 0
        if text == str(pid):
            return True
        pids = _pid_set(text)
        return pid in pids or self.live_contexts > len(pids)

    # --- callbacks (named by the YAML; they write the actor) -------------------------------

    def remember_registration(self, event: events.Event) -> None:
        """Take ``gpu`` (or a GPU count or names) and ``bundle`` from ``actor_registered``."""
        assert isinstance(event, events.ActorRegistered)
        self.gpu = event.wants_gpus
        self.gpus = event.gpus
        self.gpu_names = ",".join(event.gpu_names)
        self.uses_allocator = event.allocates_gpus
        self.bundle = event.bundle
        self.suspend_policy = event.suspend_policy
        self.containers = event.containers
        self.identity = event.identity
        self.container_gpus = {c: ",".join(n) for c, n in event.container_gpus.items()}
        self.runsc = event.runsc

    def allocate_to_run(self, event: events.Event) -> None:
        """Once GPUs are granted, inject them and create the sandbox."""
        self.gpu_next = "run"

    def allocate_to_restore(self, event: events.Event) -> None:
        """Once GPUs are granted, restore the checkpoint onto them."""
        self.gpu_next = "restore"

    def remember_gpus(self, event: events.Event) -> None:
        """Take the GPUs of ``gpus_allocated``."""
        assert isinstance(event, events.GpusAllocated)
        self.gpu_devices = ",".join(event.names)

    def forget_gpus(self, event: events.Event) -> None:
        """The actor holds no GPU any more (its last allocation is history)."""
        self.gpu_devices = ""

    def remember_bundle(self, event: events.Event) -> None:
        """Take the (re-)prepared bundle directory."""
        assert isinstance(event, events.BundlePrepared)
        self.bundle = event.bundle

    def remember_reason(self, event: events.Event) -> None:
        """Record the event's reason on the actor and the transition."""
        self.reason = event.describe() or event.type
        self.transition_reason = self.reason

    def clear_reason(self, event: events.Event) -> None:
        """The actor is healthy again."""
        self.reason = None

    def remember_sandbox(self, event: events.Event) -> None:
        """A container of this actor (may) exist in the runtime: delete it before reuse."""
        self.sandbox = True

    def forget_sandbox(self, event: events.Event) -> None:
        """No container of this actor exists in the runtime any more."""
        self.sandbox = False

    def new_sandbox(self, event: events.Event) -> None:
        """A new sandbox replaced any earlier one: nothing of the old one is live in it
        (no CUDA context, no checkpointed CUDA process)."""
        self.sandbox = True
        self.live_contexts = 0
        self.context_pids = ""
        self.cuda_pids = ""

    def note_exit(self, event: events.Event) -> None:
        """The sandbox exited mid-effect: remembered for the effect's outcome."""
        self.exited = True
        self.reason = event.describe()
        self.transition_reason = self.reason

    def clear_exit(self, event: events.Event) -> None:
        """A new effect starts: no exit seen during it yet."""
        self.exited = False

    def report_exit(self, event: events.Event) -> None:
        """The effect finished but the sandbox had exited meanwhile: stopped, with why."""
        self.exited = False
        self.transition_reason = self.reason

    def count_context_opened(self, event: events.Event) -> None:
        """The event's pid holds a context (idempotent); a pid-less open is one more."""
        pid = getattr(event, "pid", 0)
        if pid and not self.context_pids:
            # The common case, without parsing: the first pid.
            self.context_pids = str(pid)
        elif pid:
            pids = _pid_set(self.context_pids)
            if pid in pids:
                return
            pids.add(pid)
            self.context_pids = _pid_text(pids)
        self.live_contexts += 1

    def count_context_closed(self, event: events.Event) -> None:
        """The event's pid's context closed (else one pid-less context closed)."""
        pid = getattr(event, "pid", 0)
        text = self.context_pids
        if text == str(pid):
            # The common case, without parsing: the only pid closes.
            self.context_pids = ""
        elif text:
            pids = _pid_set(text)
            if pid in pids:
                self.context_pids = _pid_text(pids - {pid})
        self.live_contexts -= 1

    def clear_contexts(self, event: events.Event) -> None:
        """No context can be live (no sandbox, or the runtime proved none)."""
        self.live_contexts = 0
        self.context_pids = ""

    def refuse_live_context(self, event: events.Event) -> None:
        """Suspend refused by the machine: contexts are observed open."""
        self.reason = f"suspend refused: {self.live_contexts} live CUDA context(s) observed"
        self.transition_reason = self.reason
        self.refusal = events.REFUSED_LIVE_CONTEXT_OBSERVED

    def note_refusal(self, event: events.Event) -> None:
        """The effect refused the checkpoint (probe, runtime, or a rolled-back CUDA suspend):
        count it by reason."""
        assert isinstance(event, events.CheckpointRefused | events.CudaSuspendRefused)
        self.refusal = event.reason

    def note_code_refusal(self, event: events.Event) -> None:
        """A preflight or restore check refused: count it by its code."""
        assert isinstance(event, events.PreflightRefused | events.RestoreRefused)
        self.refusal = event.code

    def refuse_by_policy(self, event: events.Event) -> None:
        """Suspend refused by the machine: contexts are observed open and the pool refuses."""
        self.reason = (
            f"suspend refused: {self.live_contexts} live CUDA context(s) observed and the "
            "pool's GPU suspend policy is 'refuse'"
        )
        self.transition_reason = self.reason
        self.refusal = events.REFUSED_SUSPEND_POLICY

    def remember_route(self, event: events.Event) -> None:
        """The route this suspend takes for its live CUDA context."""
        assert isinstance(event, events.LiveContextFound)
        self.suspend_route = event.route

    def forget_route(self, event: events.Event) -> None:
        """A new suspend starts: no route chosen yet."""
        self.suspend_route = ""

    def remember_checkpoint_target(self, event: events.Event) -> None:
        """A new suspend starts: where its checkpoint goes (``image_path``, else default)."""
        assert isinstance(event, events.SuspendRequested)
        self.checkpoint_target = event.image_path or ""

    def remember_cuda_pids(self, event: events.Event) -> None:
        """The sandbox pids whose CUDA state was checkpointed (to resume them later)."""
        assert isinstance(event, events.CudaSuspended | events.CudaSuspendFailed)
        self.cuda_pids = event.pids

    def forget_cuda_pids(self, event: events.Event) -> None:
        """No CUDA process of the sandbox is left checkpointed (the checkpoint keeps its own
        list: another restore of it resumes them again)."""
        self.cuda_pids = ""

    def remember_checkpoint(self, event: events.Event) -> None:
        """The new checkpoint is the actor's last good one, with the CUDA pids it holds."""
        assert isinstance(event, events.CheckpointWritten)
        self.checkpoint = event.image_path
        self.checkpoint_cuda_pids = (
            self.cuda_pids if self.suspend_route == events.ROUTE_EXEC else ""
        )
        self.cuda_pids = ""

    def remember_restore_image(self, event: events.Event) -> None:
        """Restore from the image the event names (e.g. taken on another worker)."""
        image = getattr(event, "image_path", None)
        if image and image != self.checkpoint:
            self.checkpoint = image
            # Another image: this actor does not know which CUDA pids it holds.
            self.checkpoint_cuda_pids = ""

    def resume_checkpoint_cuda_pids(self, event: events.Event) -> None:
        """The restored image's CUDA processes are the ones to resume."""
        self.cuda_pids = self.checkpoint_cuda_pids


class ActorView(msgspec.Struct, frozen=True, gc=False):
    """A read-only snapshot of an :class:`Actor` (fields in :attr:`Actor.FIELDS` order).

    A msgspec ``Struct``: built in C (a frozen dataclass of 19 fields cost 25 times more,
    and replay builds one per actor); strings, numbers, None, a tuple of strings and a dict
    of strings only (nothing that can hold a view), so no GC tracking.
    """

    actor_id: str
    state: str
    gpu: bool
    bundle: str
    checkpoint: str | None
    live_contexts: int
    sandbox: bool
    reason: str | None
    exited: bool = False
    suspend_policy: str = "auto"
    suspend_route: str = ""
    cuda_pids: str = ""
    checkpoint_cuda_pids: str = ""
    context_pids: str = ""
    gpus: int = 0
    gpu_names: str = ""
    gpu_devices: str = ""
    gpu_next: str = ""
    uses_allocator: bool = False
    containers: tuple[str, ...] = ()
    identity: dict[str, str] = msgspec.field(default_factory=dict)
    checkpoint_target: str = ""
    container_gpus: dict[str, str] = msgspec.field(default_factory=dict)
    runsc: str = ""


def _methods(returns: str) -> frozenset[str]:
    return frozenset(
        name
        for name, member in vars(Actor).items()
        if callable(member)
        and not name.startswith("_")
        and name not in {"load", "snapshot"}
        and getattr(member, "__annotations__", {}).get("return") == returns
    )


#: Condition names the YAML may use (:class:`Actor` methods of the event returning bool).
CONDITIONS = _methods("bool")
#: Callback names the YAML may use (:class:`Actor` methods of the event returning None).
CALLBACKS = _methods("None")


def read_fields(actor: Actor) -> tuple[object, ...]:
    """Every persistent field of ``actor``, in :attr:`Actor.FIELDS` order (a test holds the
    two lists equal). Spelt out: slot reads compiled into the function cost a third of
    ``attrgetter(*FIELDS)``'s generic lookups, and every live event saves the fields first
    (:meth:`ActorTable.advance`)."""
    a = actor
    return (
        a.actor_id,
        a.state,
        a.gpu,
        a.bundle,
        a.checkpoint,
        a.live_contexts,
        a.sandbox,
        a.reason,
        a.exited,
        a.suspend_policy,
        a.suspend_route,
        a.cuda_pids,
        a.checkpoint_cuda_pids,
        a.context_pids,
        a.gpus,
        a.gpu_names,
        a.gpu_devices,
        a.gpu_next,
        a.uses_allocator,
        a.containers,
        a.identity,
        a.checkpoint_target,
        a.container_gpus,
        a.runsc,
    )


def restore_fields(actor: Actor, saved: tuple[object, ...]) -> None:
    """Put back what :func:`read_fields` read: undo a transition whose callback raised."""
    for name, value in zip(Actor.FIELDS, saved, strict=True):
        setattr(actor, name, value)
