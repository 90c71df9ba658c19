"""Multi-container sandboxes: the order in which a ``_pause`` root and app containers are made,
checkpointed, restored and deleted (docs/runsc.md "Multi-container sandboxes").

An actor registered with ``containers`` is a gVisor sandbox as Kubernetes' CRI makes one: a
root container ``_pause`` (no GPU devices) that boots the sandbox, and the app containers,
which join it. Each has its own OCI bundle, ``<bundle>/<name>/``. The actor's effects call
this module instead of acting on one container; single-container actors never come here.

Decisions worth knowing (seen on the pinned runsc, ``tests/runsc/test_real_sandbox.py``):

- **A runsc root per actor** (``<root>/<actor_id>``,
  :class:`~substrate_gpu.runsc.api.PerActorRoot`): container names repeat across actors.
- **A runsc binary per actor** when it names one (``actor_registered.runsc``: atelet's
  staged ``runsc_path``; :class:`~substrate_gpu.runsc.api.PerBinary`): every
  command of the sandbox, recovery's and the check's included, runs that binary.
  A runtime without per-actor roots cannot run a sandbox actor: its effects fail with
  :class:`SandboxError` saying so.
- **CRI annotations** in every bundle: ``io.kubernetes.cri.container-type`` ``sandbox`` on
  ``_pause``, ``container`` on the others with ``io.kubernetes.cri.sandbox-id: _pause``
  (what makes runsc join a container to the root's sandbox instead of booting another).
  Written atomically and only when missing or different, so a bundle that already carries
  them (atelet writes them) is left byte-for-byte as it was; read and written in a thread,
  confined to the bundle directory (a container directory that is a link, or a
  config.json that is a FIFO, fails the effect naming it: :mod:`substrate_gpu._bundle`).
- **``--nvproxy``** for a GPU actor on ``_pause``'s ``create`` (the sandbox boots there, and
  runsc's auto-detection never fires for a container without NVIDIA devices: without it the
  GPU container crashes the sentry when it joins) and on every ``restore``; the app
  containers' ``create`` takes it too (the flag is the sandbox's, harmless on a join).
- **create**: ``create _pause``, ``start _pause``, ``create`` each app (the effect named
  ``start`` then starts each app). **checkpoint**: of ``_pause``, the whole sandbox (it exits
  afterwards although ``runsc state`` still says running until the deletes). **restore**:
  ``create _pause``, ``restore … _pause``, then ``create`` + ``restore`` of each app from the
  same image (the sandbox resumes after the last one). **delete**: apps first, ``_pause``
  last; once the sandbox has exited, deleting an app fails ("connection refused", exit 128)
  and deleting ``_pause`` clears them all, so an app's failure is retried after ``_pause``'s.
- **Nothing of a deleted sandbox stays**: once every container is gone (a delete, the
  teardown after a checkpoint, the clean-up of a failed create, start or restore), what
  runsc left mounted in the actor's root (``null-netns``, one per sandbox booted under
  ``--network=none``) is detached and the root removed (:mod:`substrate_gpu.runsc.roots`).
  A root whose containers could not all be deleted is kept: it is their record.
- **GPUs per container** (:func:`container_gpus`): when the registration
  names each app container's own GPUs, each gets exactly those and one naming none gets
  none (the effects inject and verify container by container); otherwise every app
  container gets the actor's.
- **A failure part-way** (of create, start or restore) deletes what was made (apps first,
  ``_pause`` last) and raises
  :class:`SandboxError` naming the container: the effect's outcome lands on the machine's
  failure transition with that reason, and no container is left behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu import _blocking, _bundle, exceptions
from substrate_gpu.lifecycle import events, registry
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.runsc import api as runsc

PAUSE = events.PAUSE_CONTAINER
"""The sandbox's root container."""
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
"""The CRI annotation telling runsc a container's role: ``sandbox`` or ``container``."""
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
"""The CRI annotation naming the root container an app container joins."""


class SandboxError(exceptions.SubstrateGpuError):
    """A step of a sandbox's effect failed; ``container`` is the one it was acting on."""

    def __init__(self, message: str, container: str) -> None:
        super().__init__(message)
        self.container = container


@dataclass(frozen=True)
class Sandbox:
    """One actor's sandbox: its runtime (rooted at ``<root>/<actor_id>``) and bundles."""

    actor_id: str
    runtime: runsc.SandboxRuntime
    """The runtime whose ``--root`` is this actor's own."""
    bundle: Path
    """The directory holding one bundle per container."""
    apps: tuple[str, ...]
    """The app containers, in order."""

    @property
    def containers(self) -> tuple[str, ...]:
        """Every container, ``_pause`` first."""
        return (PAUSE, *self.apps)

    def bundle_of(self, name: str) -> Path:
        """``<bundle>/<name>``: that container's OCI bundle."""
        return self.bundle / name


def is_sandbox(actor: ActorView) -> bool:
    """The actor is a multi-container sandbox (registered with ``containers``)."""
    return bool(actor.containers)


def of(runtime: runsc.SandboxRuntime, actor: ActorView) -> Sandbox:
    """The sandbox of ``actor`` on ``runtime`` (under the actor's own runsc binary when it
    names one: ``actor_registered.runsc``); :class:`SandboxError` when the runtime has no
    per-actor roots (a sandbox's container names would meet another actor's), or cannot
    run another binary."""
    if actor.runsc:
        if not isinstance(runtime, runsc.PerBinary):
            raise SandboxError(
                f"sandbox {actor.actor_id}: the runtime {type(runtime).__name__} runs one runsc "
                f"and cannot run the sandbox's own ({actor.runsc}; use the runsc driver)",
                PAUSE,
            )
        runtime = runtime.for_binary(actor.runsc)
    if not isinstance(runtime, runsc.PerActorRoot):
        raise SandboxError(
            f"sandbox {actor.actor_id}: the runtime {type(runtime).__name__} has no per-actor "
            "runsc root, which a multi-container sandbox needs (use the runsc driver)",
            PAUSE,
        )
    return Sandbox(
        actor_id=actor.actor_id,
        runtime=runtime.for_actor(actor.actor_id),
        bundle=Path(actor.bundle),
        apps=actor.containers,
    )


# --- GPUs per container -------------------------------------------------------------------


def container_gpus(
    actor: ActorView, name: str, aliases: Mapping[str, str] | None = None
) -> tuple[str, ...] | None:
    """The GPUs app container ``name`` of ``actor``'s sandbox gets: None for the actor's
    own (no container names its GPUs: the seed PR's rule, every app container all of
    them); else the names its own config asked for, each as the allocator's canonical name
    of that GPU (``aliases``; as asked without one), and () for a container that asked for
    none."""
    if not actor.container_gpus:
        return None
    own = actor.container_gpus.get(name, "")
    found = aliases or {}
    return tuple(found.get(n, n) for n in own.split(",")) if own else ()


# --- CRI annotations ----------------------------------------------------------------------


def cri_annotations(name: str) -> dict[str, str]:
    """The annotations runsc reads to place container ``name`` in the sandbox."""
    if name == PAUSE:
        return {CONTAINER_TYPE: "sandbox"}
    return {CONTAINER_TYPE: "container", SANDBOX_ID: PAUSE}


def annotated(config: Mapping[str, object], name: str) -> dict[str, object] | None:
    """``config`` (a parsed config.json) with container ``name``'s CRI annotations, or None
    when it has them already. ValueError when its annotations are not an object."""
    annotations = config.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise ValueError("its 'annotations' is not an object")  # noqa: TRY004 (the file's)
    wanted = cri_annotations(name)
    if all(annotations.get(k) == v for k, v in wanted.items()):
        return None
    return {**config, "annotations": {**annotations, **wanted}}


def ensure_annotations(bundle_dir: Path, name: str) -> bool:
    """Give ``<bundle_dir>/<name>/config.json`` the CRI annotations of container ``name``;
    True when the file was rewritten (atomically, its mode kept), False when it already had
    them (left byte-for-byte as it was).

    The container's directory is a real one of ``bundle_dir`` and config.json a regular
    file, read without blocking (:mod:`substrate_gpu._bundle`): a link or a FIFO is refused.
    This blocks; on the event loop, run it in a thread (as :func:`create` and
    :func:`restore` do). Raises :class:`SandboxError` naming the container when the config
    cannot be read, parsed or written.
    """
    doing = f"while annotating container {name}'s bundle"
    try:
        with _bundle.open_container(bundle_dir, name) as bundle:
            config, mode = bundle.read_config()
            try:
                rewritten = annotated(config, name)
            except ValueError as e:
                raise SandboxError(
                    f"{doing}: {bundle.config_path} is not an OCI config: {e}", name
                ) from e
            if rewritten is None:
                return False
            bundle.write_config(rewritten, mode)
    except _bundle.BundleFileError as e:
        raise SandboxError(f"{doing}: {e}", name) from e
    return True


async def _annotate(sandbox: Sandbox) -> None:
    """Every container's annotations, in a thread (file I/O never runs on the event loop;
    abandoned, like any blocking step, if the effect is cancelled)."""

    def annotate_all() -> None:
        for name in sandbox.containers:
            ensure_annotations(sandbox.bundle, name)

    await _blocking.run_abandonable(annotate_all, name="substrate-gpu annotate")


# --- the effects' orders --------------------------------------------------------------------


def _failed(sandbox: Sandbox, doing: str, name: str, error: BaseException) -> SandboxError:
    message = str(error) or type(error).__name__
    return SandboxError(
        f"while {doing} container {name} of sandbox {sandbox.actor_id}: {message}", name
    )


async def _create_pause(sandbox: Sandbox, *, nvproxy: bool) -> None:
    """``create _pause``; if it exists already, the sandbox is a leftover: deleted, and the
    create tried once more. (A runsc command of an agent killed mid-effect runs on in its
    own session and may finish after recovery decided nothing was made: its sandbox would
    otherwise block every later create or restore of the actor.)"""
    try:
        await sandbox.runtime.create(PAUSE, sandbox.bundle_of(PAUSE), nvproxy=nvproxy)
    except runsc.ContainerExistsError:
        await delete_quietly(sandbox)
        await sandbox.runtime.create(PAUSE, sandbox.bundle_of(PAUSE), nvproxy=nvproxy)


async def create(sandbox: Sandbox, *, nvproxy: bool) -> None:
    """``create _pause`` (``--nvproxy`` for a GPU sandbox), ``start _pause``, ``create``
    each app. On a failure, what was made is deleted and :class:`SandboxError` raised."""
    await _annotate(sandbox)
    runtime = sandbox.runtime
    made: list[str] = []
    step, name = "creating", PAUSE
    try:
        await _create_pause(sandbox, nvproxy=nvproxy)
        made.append(PAUSE)
        step = "starting"
        await runtime.start(PAUSE)
        step = "creating"
        for name in sandbox.apps:
            await runtime.create(name, sandbox.bundle_of(name), nvproxy=nvproxy)
            made.append(name)
    except exceptions.SubstrateGpuError as e:
        await delete_quietly(sandbox, made)
        raise _failed(sandbox, step, name, e) from e


async def start(sandbox: Sandbox) -> None:
    """``start`` each app container, in order (``_pause`` runs since ``create``). On a
    failure the whole sandbox is deleted (a part-started one is no actor's state) and
    :class:`SandboxError` raised."""
    for name in sandbox.apps:
        try:
            await sandbox.runtime.start(name)
        except exceptions.SubstrateGpuError as e:
            await delete_quietly(sandbox)
            raise _failed(sandbox, "starting", name, e) from e


async def checkpoint(
    sandbox: Sandbox,
    image: Path,
    *,
    leave_running: bool,
    cuda_checkpoint_path: Path | None = None,
    cuda_checkpoint_sequential: bool = False,
) -> None:
    """``checkpoint --image-path I _pause``: the whole sandbox, every container in one image.
    runsc's typed errors pass through unchanged (the effect tells refusals from failures)."""
    await sandbox.runtime.checkpoint(
        PAUSE,
        image,
        leave_running=leave_running,
        cuda_checkpoint_path=cuda_checkpoint_path,
        cuda_checkpoint_sequential=cuda_checkpoint_sequential,
    )


async def restore(sandbox: Sandbox, image: Path, *, nvproxy: bool) -> None:
    """``create`` + ``restore --detach`` of ``_pause``, then of each app, all from ``image``
    (``--nvproxy`` on each for a GPU sandbox). On a failure, what was made is deleted and
    :class:`SandboxError` raised."""
    await _annotate(sandbox)
    runtime = sandbox.runtime
    made: list[str] = []
    for name in sandbox.containers:
        step = "creating"
        try:
            if name == PAUSE:
                await _create_pause(sandbox, nvproxy=nvproxy)
            else:
                await runtime.create(name, sandbox.bundle_of(name), nvproxy=nvproxy)
            made.append(name)
            step = "restoring"
            await runtime.restore(name, sandbox.bundle_of(name), image, nvproxy=nvproxy)
        except exceptions.SubstrateGpuError as e:
            await delete_quietly(sandbox, made)
            raise _failed(sandbox, step, name, e) from e


def _delete_order(names: Iterable[str]) -> list[str]:
    """Apps first (last made first), ``_pause`` last."""
    chosen = list(names)
    return [n for n in reversed(chosen) if n != PAUSE] + ([PAUSE] if PAUSE in chosen else [])


async def delete(sandbox: Sandbox) -> None:
    """``delete --force`` every container, apps first and ``_pause`` last; a container runsc
    does not know is gone already. An app that fails before ``_pause`` is deleted (its
    sandbox exited: "connection refused") is deleted again after it, when it must be gone;
    :class:`SandboxError` names the first container that could not be deleted. Once all
    are gone the actor's root is unmounted and removed (:func:`remove_root`)."""
    await _delete_containers(sandbox)
    await remove_root(sandbox)


async def _delete_containers(sandbox: Sandbox) -> None:
    retry: list[str] = []
    for name in _delete_order(sandbox.containers):
        try:
            await sandbox.runtime.delete(name, force=True)
        except runsc.ContainerNotFoundError:
            pass
        except exceptions.SubstrateGpuError as e:
            if name == PAUSE:
                raise _failed(sandbox, "deleting", name, e) from e
            retry.append(name)
    for name in retry:
        try:
            await sandbox.runtime.delete(name, force=True)
        except runsc.ContainerNotFoundError:
            pass
        except exceptions.SubstrateGpuError as e:
            raise _failed(sandbox, "deleting", name, e) from e


async def delete_quietly(sandbox: Sandbox, names: Iterable[str] | None = None) -> bool:
    """Best-effort delete (cleanup, never an outcome) of ``names`` (default: every
    container, and then, when every one is gone, the actor's root: :func:`remove_root`),
    apps first, ``_pause`` last. Whether every one of them is gone (deleted, or unknown to
    runsc); False: one may still run."""
    order = _delete_order(sandbox.containers if names is None else names)
    gone: set[str] = set()

    async def attempt(name: str) -> None:
        try:
            await sandbox.runtime.delete(name, force=True)
        except runsc.ContainerNotFoundError:
            gone.add(name)
        except exceptions.SubstrateGpuError:
            return
        else:
            gone.add(name)

    for name in order:
        await attempt(name)
    # Apps of an exited sandbox refuse until _pause is gone: once more, after it.
    for name in order[:-1] if order and order[-1] == PAUSE else ():
        if name not in gone:
            await attempt(name)
    every = gone >= set(order)
    if names is None and every:
        with contextlib.suppress(SandboxError):
            await remove_root(sandbox)
    return every


def has_root(sandbox: Sandbox) -> bool:
    """Whether the actor's own root may still hold something (a runtime that cannot tell:
    no)."""
    runtime = sandbox.runtime
    return isinstance(runtime, runsc.RemovableRoot) and runtime.has_root()


async def remove_root(sandbox: Sandbox) -> None:
    """Unmount what runsc left under the actor's own root (``null-netns``) and remove it,
    with the actor's pid-file directory, once none of its containers is left (upstream's
    worker resets them the same way at Run, Restore and Terminate). A runtime without
    per-actor roots to remove is left alone; :class:`SandboxError` when something stays."""
    runtime = sandbox.runtime
    if not isinstance(runtime, runsc.RemovableRoot):
        return
    try:
        await runtime.remove_root()
    except OSError as e:
        raise SandboxError(
            f"while removing the runsc root of sandbox {sandbox.actor_id}: {e}", PAUSE
        ) from e


# --- what the runtime says, for recovery -------------------------------------------------------

#: Effects whose recovery asks about the sandbox itself (``_pause``'s state is the
#: sandbox's): whether it still runs, not how far the containers got.
_SANDBOX_WIDE = frozenset({"checkpoint", "probe", "cuda_suspend", "cuda_resume"})


async def statuses(sandbox: Sandbox) -> dict[str, registry.RuntimeStatus]:
    """``runsc state`` of every container (``missing`` when runsc does not know it,
    ``unknown`` when it could not say)."""
    found: dict[str, registry.RuntimeStatus] = {}
    for name in sandbox.containers:
        try:
            state = await sandbox.runtime.state(name)
        except runsc.ContainerNotFoundError:
            found[name] = "missing"
        except exceptions.SubstrateGpuError:
            found[name] = "unknown"
        else:
            found[name] = state.status
    return found


def summarize(effect: str, found: Mapping[str, registry.RuntimeStatus]) -> registry.RuntimeStatus:
    """One status for the sandbox, as the effect's recovery rule reads a container's.

    - ``checkpoint`` and the CUDA effects: ``_pause``'s (the sandbox runs, or not);
    - otherwise: ``missing`` when nothing exists; the apps' common status while ``_pause``
      runs, when it is ``created`` (a whole ``create``) or ``running`` (a whole ``start``
      or ``restore``); every container's when they all agree; and ``creating`` (part-made,
      the status every rule reads as "the effect did not complete") for any other mix, such
      as ``_pause`` running beside missing apps.
    """
    values = set(found.values())
    if "unknown" in values:
        return "unknown"
    pause = found[PAUSE]
    if effect in _SANDBOX_WIDE:
        return pause
    if values == {"missing"}:
        return "missing"
    if len(values) == 1 and not (pause == "created" and len(found) > 1):
        # (every container merely created: never a whole create, which starts _pause)
        return pause
    apps = {status for name, status in found.items() if name != PAUSE}
    if pause in {"running", "paused"} and len(apps) == 1 and apps <= {"created", "running"}:
        return apps.pop()
    return "creating"


def describe(found: Mapping[str, registry.RuntimeStatus]) -> str:
    """``_pause running, app created, sidecar missing``: for recovery's report."""
    return ", ".join(f"{name} {status}" for name, status in found.items())
