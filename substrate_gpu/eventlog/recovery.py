"""Recovery: resume every actor where the log left it, reconciling interrupted effects.

An actor the log leaves in an in-flight state (a state with an ``effect:`` in
``machines/actor.yaml``) was mid-effect when the agent died: the event that entered the
state is durable (logged before the effect started), the outcome is not. Re-running the
effect blindly could run it twice (a second ``runsc create``, a second checkpoint over the
first). Instead recovery **asks the runtime** (``runsc state``) what happened and decides,
per :func:`decide`, by the effect's ``recovery`` rule in the effect registry
(:mod:`substrate_gpu.lifecycle.registry`, which also supplies each effect's failure and
success outcomes). The rules, as a table:

==============  =====================================  ===========================================
state (effect)  the runtime says                       recovery
==============  =====================================  ===========================================
injecting       (not asked)                            rerun ``inject`` (idempotent by design)
probing         (not asked)                            rerun ``probe`` (reads /proc only)
creating        created                                ``sandbox_created`` (then ``start`` runs)
creating        running, paused                        ``sandbox_created``, ``sandbox_started``
                                                       (``start`` ran before ``sandbox_created``
                                                       was durable: it is not run again)
creating        missing                                ``effect_failed`` (create)
creating        creating, stopped                      delete it, ``effect_failed`` (create)
starting        running, paused                        ``sandbox_started``
starting        created                                rerun ``start`` (it provably had no effect)
starting        missing, creating, stopped             delete leftover, ``effect_failed`` (start)
checkpointing   running, paused                        ``checkpoint_failed``, sandbox survived
checkpointing   gone (stopped, missing), image whole   delete leftover, ``checkpoint_written``
checkpointing   gone, no whole image                   ``checkpoint_failed``, sandbox lost
restoring       running, paused                        ``restored`` (exec-route CUDA state
                                                       when the checkpoint keeps CUDA pids)
restoring       missing, creating, created, stopped    delete leftover, ``restore_failed``
deleting        missing                                ``deleted``
deleting        exists                                 rerun ``delete`` (``--force``, idempotent)
cuda_resuming   running, paused                        rerun ``cuda_resume`` (idempotent)
cuda_resuming   gone                                   delete leftover, ``cuda_resume_failed``
cuda_suspending (not asked)                            ``effect_timed_out`` (which processes
                                                       were locked is not logged: failed,
                                                       a retry replaces the sandbox)
any             state unreadable (runsc error)         the effect's failure outcome
unknown effect  (not asked)                            ``effect_timed_out`` (accepted by every
                                                       in-flight state: failed, recoverable)
==============  =====================================  ===========================================

A multi-container sandbox (an actor registered with ``containers``) is asked container by
container, under its own runsc root, and its statuses summed up into the one the rule reads
(:func:`substrate_gpu.lifecycle.sandbox.summarize`): ``_pause``'s for ``checkpointing`` and
the CUDA effects (does the sandbox run?); otherwise ``missing`` when nothing exists, the app
containers' common status while ``_pause`` runs (``created`` after a whole create,
``running`` after a whole start or restore), and ``creating`` for a part-made sandbox,
which every rule reads as "did not complete": its leftovers are deleted, apps first.

**Before anything is asked**, every runsc command the killed agent left running under its
root is killed and waited for (:meth:`~substrate_gpu.runsc.driver.RunscDriver.reap_stragglers`;
they die with the agent anyway, ``PR_SET_PDEATHSIG``): a ``runsc start side`` landing after
the decision would start a container of a sandbox just deleted as part-made, beside GPUs
just handed to another actor.

**GPUs follow what runs.** After the decisions, every GPU actor whose sandbox
may exist (in flight, or its record says so) is asked again; the GPUs injected in a sandbox
with a live container (its bundles' ``/dev/nvidiaN`` nodes and ``cdi.k8s.io/*``
annotations) go to the agent as :class:`~substrate_gpu.lifecycle.allocation.LiveSandbox`
records: held whatever the log says, every difference from the log warned about and
counted, until that sandbox is gone (the agent deletes one left by an actor that no longer
holds GPUs before freeing them).

Why a live sandbox in ``checkpointing`` means "failed, survived" even when an image exists:
a ``runsc checkpoint`` started in its own session outlives the agent and may still be
writing that image; the running sandbox is the actor's state, and a new suspend can be
requested. Only once the sandbox is gone is the image the actor's state (taken when whole).

Why a sandbox running in ``creating`` is reconciled as created *and* started: the pipeline
does not wait for ``sandbox_created`` to be durable before ``start`` runs (it is
``rederived``: docs/event-log.md, "When an event is durable"), so a crash can leave the log in
``creating`` after the start. Only ``start`` makes the apps run, so both happened; the
actor gets both outcomes, and ``start`` is not run again.

Outcomes are *not* applied here: the :class:`ResumePoint` carries them to the restarted
:class:`~substrate_gpu.lifecycle.Agent`, which accepts them like any outcome (logged before
acted on, observed, follow-up effects started). :attr:`Recovery.actors` shows the states
they will produce. Recovering twice is safe: outcomes already logged moved the actors out
of their in-flight states, and the others are reconciled again.
"""

from __future__ import annotations

import contextlib
import functools
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from substrate_gpu import _blocking, _bundle, exceptions
from substrate_gpu.eventlog import errors, reader, replayer, seqmark
from substrate_gpu.lifecycle import actors, allocation, effects, events, machine, registry, sandbox
from substrate_gpu.lifecycle.agent import ResumePoint
from substrate_gpu.runsc import api as runsc

#: Why recovery produced an outcome (in every reconciliation outcome's message).
INTERRUPTED = "interrupted by an agent restart"

Status = registry.RuntimeStatus


@dataclass(frozen=True)
class Decision:
    """What to do with one actor found mid-effect."""

    action: Literal["outcome", "rerun"]
    """Accept ``outcome``, or run the state's effect again."""
    outcome: events.Event | None = None
    """The outcome event (unstamped) when ``action`` is ``outcome``."""
    delete_leftover: bool = False
    """``runsc delete --force`` the container first (what the effect itself would do)."""
    why: str = ""
    """One line for the report."""
    then: events.Event | None = None
    """A second outcome, accepted after ``outcome``: the effect ``outcome`` starts
    completed too, before ``outcome`` was durable (``RecoveryAction.FOLLOWED``)."""

    @property
    def outcomes(self) -> tuple[events.Event, ...]:
        """``outcome`` and ``then``, those there are, in order."""
        return tuple(o for o in (self.outcome, self.then) if o is not None)


@dataclass(frozen=True)
class Reconciliation:
    """The report line for one actor found mid-effect."""

    actor_id: str
    state: str
    """The in-flight state the log left it in."""
    effect: str
    runtime: str
    """What the runtime said (a status, ``missing``, ``not asked`` or the error)."""
    decision: Decision

    def describe(self) -> str:
        """One human line."""
        what = (
            f"-> {', '.join(o.type for o in self.decision.outcomes)}"
            if self.decision.outcome is not None
            else f"rerun {self.effect}"
        )
        cleanup = ", leftover container deleted" if self.decision.delete_leftover else ""
        return (
            f"actor {self.actor_id}: {self.state} ({self.effect} interrupted), runtime says "
            f"{self.runtime}: {what}{cleanup} ({self.decision.why})"
        )


@dataclass(frozen=True)
class Recovery:
    """Where a restarted agent resumes (pass :attr:`resume` to ``Agent(resume=...)``)."""

    path: Path
    actors: dict[str, actors.ActorView]
    """Every actor as it will be once the reconciliation outcomes are accepted."""
    last_seq: int
    """The highest seq logged: the log's last, or its seq mark's when the log lost its tail."""
    reconcile_events: tuple[events.Event, ...]
    """Outcomes established by asking the runtime, for the agent to accept (unstamped)."""
    rerun: tuple[str, ...]
    """Actors whose effect the agent runs again (idempotent, or provably had no effect)."""
    report: tuple[Reconciliation, ...]
    """One line per actor found mid-effect."""
    resume: ResumePoint
    """What ``Agent(resume=...)`` takes."""
    torn_tail: reader.TornTail | None = None
    """The torn last line dropped from the log, if any."""
    live: tuple[allocation.LiveSandbox, ...] = ()
    """GPU sandboxes found live after the reconciliation, with the GPUs injected in them."""
    reaped: tuple[int, ...] = ()
    """The pids of runsc commands of the killed agent that were still running (killed)."""


def image_is_whole(image: Path) -> bool:
    """The default completeness test of a checkpoint image: ``checkpoint.img`` is a non-empty
    regular file (not a link, not a directory).

    runsc writes no completion marker; this is only trusted once the sandbox is gone. A
    failed checkpoint can leave an empty ``checkpoint.img`` behind (runsc creates it with
    ``O_EXCL`` before writing), which is not an image.
    """
    try:
        st = (image / "checkpoint.img").lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def decide(
    view: actors.ActorView,
    effect: str,
    status: Status,
    *,
    image: Path | None = None,
    image_whole: bool = False,
) -> Decision:
    """The effect's recovery rule (the registry's), applied to what the runtime said."""
    actor_id = view.actor_id
    spec = registry.REGISTRY.get(effect)
    if spec is None:
        # A newer machine's effect: the one outcome every in-flight state accepts, which
        # fails the actor recoverably and remembers a possible container.
        return Decision(
            "outcome",
            events.EffectTimedOut(actor_id=actor_id, effect=effect, seconds=0.0),
            why=f"no reconciliation rule for effect {effect!r}; failed as interrupted",
        )
    rule = spec.recovery
    action = rule.action(status)
    exists = status not in {"missing", "unknown"}
    leftover = rule.deletes_leftover and exists
    Action = registry.RecoveryAction
    if status == "unknown":
        return Decision(
            "outcome",
            spec.failure(view, f"{INTERRUPTED}: the runtime's state could not be read"),
            why="cannot tell what happened",
        )
    if action is Action.RERUN:
        return Decision("rerun", why=rule.why or f"the container is {status}")
    if action is Action.SUCCEEDED:
        assert spec.success is not None, f"effect {effect}: SUCCEEDED needs a success outcome"
        return Decision("outcome", spec.success(view), why=f"the {effect} completed")
    if action is Action.FOLLOWED:
        following = registry.REGISTRY[rule.then] if rule.then is not None else None
        assert spec.success is not None and following is not None and following.success
        return Decision(
            "outcome",
            spec.success(view),
            then=following.success(view),
            why=f"the {effect} completed, and the {rule.then} it starts too",
        )
    if action is Action.SANDBOX_RUNS:
        return Decision(
            "outcome",
            events.CheckpointFailed(
                actor_id=actor_id,
                message=f"{INTERRUPTED}; the sandbox still runs",
                sandbox_survived=True,
            ),
            why="the sandbox still runs; an image, if any, is not trusted",
        )
    if action is Action.IMAGE_IF_WHOLE:
        if image is not None and image_whole:
            return Decision(
                "outcome",
                events.CheckpointWritten(actor_id=actor_id, image_path=str(image)),
                delete_leftover=leftover,
                why="the sandbox is gone and its image is whole",
            )
        return Decision(
            "outcome",
            spec.failure(view, f"{INTERRUPTED}; the sandbox is {status} and no whole image exists"),
            delete_leftover=leftover,
            why="the sandbox is gone without a whole image; the last good checkpoint is kept",
        )
    if action is Action.INTERRUPTED:
        return Decision(
            "outcome",
            events.EffectTimedOut(actor_id=actor_id, effect=effect, seconds=0.0),
            why=f"what the interrupted {effect} did cannot be asked; failed, recoverable",
        )
    return Decision(
        "outcome",
        spec.failure(view, f"{INTERRUPTED}: the container is {status}"),
        delete_leftover=leftover,
        why=f"the {effect} did not complete",
    )


async def _sandbox_status(
    runtime: runsc.SandboxRuntime, view: actors.ActorView, effect: str
) -> tuple[Status, str]:
    """One status for a sandbox actor's containers, as the effect's rule reads one."""
    try:
        found = await sandbox.statuses(sandbox.of(runtime, view))
    except exceptions.SubstrateGpuError as e:
        return "unknown", f"unreadable ({e})"
    return sandbox.summarize(effect, found), f"sandbox: {sandbox.describe(found)}"


async def _delete_leftover(runtime: runsc.SandboxRuntime, view: actors.ActorView) -> None:
    """What the interrupted effect itself would have done: delete the container, or every
    container of a sandbox (apps first, ``_pause`` last)."""
    with contextlib.suppress(exceptions.SubstrateGpuError):
        if sandbox.is_sandbox(view):
            await sandbox.delete_quietly(sandbox.of(runtime, view))
        else:
            await runtime.delete(view.actor_id, force=True)


async def _remove_leftover_root(runtime: runsc.SandboxRuntime, view: actors.ActorView) -> None:
    """A delete interrupted after its containers went: its last step, the sandbox's root
    unmounted and removed (its null-netns would otherwise stay mounted for ever)."""
    if not sandbox.is_sandbox(view):
        return
    with contextlib.suppress(exceptions.SubstrateGpuError):
        box = sandbox.of(runtime, view)
        if sandbox.has_root(box):
            await sandbox.delete_quietly(box)


#: A GPU node in ``linux.devices`` (``/dev/nvidia0``; not nvidiactl, uvm, caps).
_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")
#: The annotation prefix CDI-aware runtimes read device requests from.
_CDI_ANNOTATION = "cdi.k8s.io/"
#: Statuses of a container that may be running (``unknown``: it could not be asked).
_MAY_RUN: frozenset[Status] = frozenset({"creating", "created", "running", "paused", "unknown"})


def injected_gpus(config: Mapping[str, object]) -> tuple[str, ...]:
    """The GPUs a parsed config.json gives its container: the ``/dev/nvidiaN`` paths of its
    ``linux.devices`` and the qualified names of its ``cdi.k8s.io/*`` annotations, in the
    order found (pure; a malformed part is skipped: this is evidence, not validation)."""
    found: list[str] = []
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    for device in devices if isinstance(devices, list) else ():
        path = device.get("path") if isinstance(device, dict) else None
        if isinstance(path, str) and _GPU_NODE.fullmatch(path):
            found.append(path)
    annotations = config.get("annotations")
    for key, value in annotations.items() if isinstance(annotations, dict) else ():
        if isinstance(key, str) and key.startswith(_CDI_ANNOTATION) and isinstance(value, str):
            found.extend(name.strip() for name in value.split(",") if name.strip())
    return tuple(dict.fromkeys(found))


def _read_injected(bundle: str, containers: tuple[str | None, ...]) -> tuple[str, ...]:
    """What :func:`injected_gpus` finds in each container's bundle (blocking; confined to
    the bundle directory; an unreadable one contributes nothing)."""
    found: list[str] = []
    for name in containers:
        with contextlib.suppress(_bundle.BundleFileError):
            config, _mode = _bundle.read_config(bundle, name)
            found.extend(injected_gpus(config))
    return tuple(dict.fromkeys(found))


async def _live_sandbox(
    runtime: runsc.SandboxRuntime, view: actors.ActorView
) -> allocation.LiveSandbox | None:
    """The GPU actor's sandbox as the runtime shows it, when a container of it may run."""
    if sandbox.is_sandbox(view):
        try:
            found = await sandbox.statuses(sandbox.of(runtime, view))
        except sandbox.SandboxError:
            return None
        bundles: tuple[str | None, ...] = view.containers
    else:
        status, _said = await _status(runtime, view.actor_id)
        found = {view.actor_id: status}
        bundles = (None,)
    live = tuple(name for name, status in found.items() if status in _MAY_RUN)
    if not live:
        return None
    injected = await _blocking.run_abandonable(
        functools.partial(_read_injected, view.bundle, bundles), name="substrate-gpu evidence"
    )
    return allocation.LiveSandbox(actor_id=view.actor_id, injected=injected, containers=live)


async def _reap(runtime: runsc.SandboxRuntime) -> tuple[int, ...]:
    """Kill the killed agent's runsc commands (module doc) before anything is asked."""
    if not isinstance(runtime, runsc.StragglerReaper):
        return ()
    return await runtime.reap_stragglers()


async def _status(runtime: runsc.SandboxRuntime, actor_id: str) -> tuple[Status, str]:
    try:
        state = await runtime.state(actor_id)
    except runsc.ContainerNotFoundError:
        return "missing", "missing"
    except exceptions.SubstrateGpuError as e:
        return "unknown", f"unreadable ({e})"
    return state.status, state.status


async def recover(
    path: Path,
    *,
    runtime: runsc.SandboxRuntime,
    checkpoint_root: Path | None = None,
    machine_spec: machine.MachineSpec | None = None,
    image_whole: Callable[[Path], bool] = image_is_whole,
) -> Recovery:
    """Replay the log at ``path`` and reconcile every actor found mid-effect (module doc).

    ``checkpoint_root`` should be the agent's (checkpoint images are
    ``<checkpoint_root>/<actor>/<seq of the suspend>``); without it no image is trusted
    (an actor whose sandbox is gone mid-checkpoint keeps its last good checkpoint). Only
    leftover containers are touched (deleted, as the interrupted effect itself would have);
    outcomes are returned for the restarted agent to accept and log.
    """
    spec = machine_spec or machine.load_spec()
    result = replayer.replay(path, machine_spec=spec, keep_transitions=False)
    reaped = await _reap(runtime)
    report: list[Reconciliation] = []
    outcomes: list[events.Event] = []
    rerun: list[tuple[str, events.Event]] = []
    for actor_id in sorted(result.actors):
        view = result.actors[actor_id]
        effect = spec.effects.get(view.state)
        if effect is None:
            continue
        cause = result.causes.get(actor_id)
        if cause is None:
            raise errors.EventLogError(
                f"while recovering actor {actor_id!r} from {path}: it is in {view.state!r} "
                "but the log does not hold the event that entered that state"
            )
        spec_entry = registry.REGISTRY.get(effect)
        if spec_entry is None or not spec_entry.recovery.asks_runtime:
            status: Status = "missing"
            said = "not asked"
        elif sandbox.is_sandbox(view):
            status, said = await _sandbox_status(runtime, view, effect)
        else:
            status, said = await _status(runtime, actor_id)
        image = None
        if effect == "checkpoint" and view.checkpoint_target:
            image = Path(view.checkpoint_target)  # the suspend chose it (no root needed)
        elif effect == "checkpoint" and checkpoint_root is not None:
            image = effects.checkpoint_image(checkpoint_root, view, cause.seq)
        decision = decide(
            view,
            effect,
            status,
            image=image,
            image_whole=image is not None and image_whole(image),
        )
        if decision.delete_leftover:
            await _delete_leftover(runtime, view)
        elif isinstance(decision.outcome, events.Deleted):
            await _remove_leftover_root(runtime, view)
        report.append(Reconciliation(actor_id, view.state, effect, said, decision))
        if decision.outcome is not None:
            outcomes.extend(decision.outcomes)
        else:
            rerun.append((actor_id, cause))
    # What the agent will hold once it accepted the outcomes (the same machine, no effect).
    # New events are numbered after the highest seq ever logged, which the log's last line
    # may have lost (seqmark): a seq once acknowledged is never handed out again.
    last_seq = max(result.last_seq, seqmark.read(path))
    predicted = replayer.Replayer(spec)
    predicted.load_views(result.actors.values(), result.last_seq)
    for outcome in outcomes:
        predicted.apply(outcome)
    # What runs now, for every GPU actor whose sandbox may exist (module doc).
    live: list[allocation.LiveSandbox] = []
    for actor_id in sorted(result.actors):
        view = result.actors[actor_id]
        if not view.gpu or view.state in spec.final_states:
            continue
        if view.state not in spec.effects and not view.sandbox:
            continue
        found = await _live_sandbox(runtime, view)
        if found is not None:
            live.append(found)
    return Recovery(
        path=path,
        actors=predicted.views(),
        last_seq=last_seq,
        reconcile_events=tuple(outcomes),
        rerun=tuple(a for a, _ in rerun),
        report=tuple(report),
        resume=ResumePoint(
            actors=tuple(result.actors.values()),
            last_seq=last_seq,
            outcomes=tuple(outcomes),
            rerun=tuple(rerun),
            live=tuple(live),
        ),
        torn_tail=result.torn_tail,
        live=tuple(live),
        reaped=reaped,
    )
