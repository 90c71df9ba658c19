"""External events: what the node agent submits (through :meth:`Agent.submit`), from an
actor's registration to its deletion, plus what it observes of the sandbox (CUDA contexts
opened and closed, the sandbox's exit)."""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

import msgspec

from substrate_gpu.lifecycle import errors
from substrate_gpu.lifecycle.events.base import (
    SUSPEND_POLICIES,
    Event,
    SuspendPolicy,
    register,
)

#: The root container of a multi-container sandbox (implied, never listed in ``containers``).
PAUSE_CONTAINER: Final = "_pause"
#: What an app container's name may be: it becomes a runsc container id and a directory
#: name under the actor's bundle directory (``_pause`` cannot match: it starts with ``_``).
CONTAINER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: The most app containers one sandbox may name (a bound for the door, not a runsc limit).
CONTAINERS_MAX: Final = 64
#: The most identity entries a registration may carry (upstream sends five).
IDENTITY_MAX: Final = 32


@register
class ActorRegistered(Event, frozen=True, kw_only=True, tag="actor_registered"):
    """The node agent knows a new actor.

    Version 2 (GPU allocation): a GPU actor's GPUs come from the worker's allocator. A v1
    line (written before allocation existed) keeps its meaning: all of the worker's GPUs,
    injected without allocation (:attr:`allocates_gpus` is False), so old logs replay as
    they were written.

    Version 3 (sandboxes): ``containers`` names the app containers of a multi-container
    sandbox and ``identity`` carries the caller's opaque identity. A v1 or v2 line has
    neither (both empty: a single-container actor, as it was written); one that carries
    them is refused, so an older agent's meaning is never silently extended.

    Version 4 (GPUs per container, a runsc per sandbox): ``container_gpus`` names, per app
    container, the GPUs its own config asked for (the other app containers get none), and
    ``runsc`` the runsc binary the sandbox runs under (atelet's staged ``runsc_path``). A
    v1 to v3 line has neither (every app container gets the actor's GPUs, the agent's own
    runsc, as it was written); one that carries either is refused.
    """

    v: Literal[1, 2, 3, 4] = 4  # type: ignore[assignment]  # reads v1 to v4 (see above)
    gpu: bool
    """The actor's pool requests GPUs: inject them and use nvproxy."""
    bundle: str
    """The OCI bundle directory of the actor's container; for a sandbox (``containers``
    given), the directory holding one bundle per container: ``<bundle>/_pause/`` and
    ``<bundle>/<name>/`` for each app container."""
    suspend_policy: SuspendPolicy = "auto"
    """The pool's GPU suspend policy: ``auto`` suspends a live CUDA context through the best
    route the node has (refusing when there is none), ``refuse`` always refuses while a
    context is live (the upstream behaviour). Optional: older logs read as ``auto``."""
    gpus: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0
    """How many of the worker's GPUs (lowest free indices first); 0: see ``gpu_names``, else
    all of them. Optional: older logs read as 0 (``gpu`` alone means all GPUs, as before)."""
    gpu_names: tuple[str, ...] = ()
    """Fully qualified CDI names (``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``, a DRA
    claim's names): exactly these GPUs. Optional: older logs read as none."""
    containers: Annotated[tuple[str, ...], msgspec.Meta(max_length=CONTAINERS_MAX)] = ()
    """The app containers of the actor's sandbox, in order (``_pause``, its root, is implied
    and never listed). Empty: one container whose id is the actor id (before v3). Every app
    container gets the actor's GPUs, unless ``container_gpus`` says otherwise; ``_pause``
    none."""
    identity: Annotated[dict[str, str], msgspec.Meta(max_length=IDENTITY_MAX)] = {}  # noqa: RUF012 (msgspec copies it)
    """The caller's identity of the actor (upstream: atespace, actor_name, actor_uid, ...):
    opaque to the lifecycle, kept on the actor record and shown by queries."""
    container_gpus: Annotated[
        dict[str, tuple[str, ...]], msgspec.Meta(max_length=CONTAINERS_MAX)
    ] = {}  # noqa: RUF012 (a msgspec Struct copies a mutable default)
    """App container -> the qualified CDI names its own config requests (v4). Empty: every
    app container gets the actor's GPUs (the seed PR's rule). Given: each named container
    gets exactly its own, every app container not named gets none, ``_pause`` never; the
    names together are ``gpu_names`` (the sandbox's allocation is their union)."""
    runsc: str = ""
    """The runsc binary the sandbox runs under (v4; an absolute path, e.g. the one atelet
    staged for this activation); empty: the agent's own (``--runsc``). Only a sandbox
    (``containers`` given) runs under a binary of its own."""

    @property
    def allocates_gpus(self) -> bool:
        """GPUs come from the allocator: every registration since v2."""
        return self.v >= 2

    @property
    def wants_gpus(self) -> bool:
        """A GPU actor: ``gpu``, a count or names."""
        return self.gpu or self.gpus > 0 or bool(self.gpu_names)

    @property
    def is_sandbox(self) -> bool:
        """A multi-container sandbox (``_pause`` plus the app ``containers``)."""
        return bool(self.containers)

    @property
    def per_container(self) -> bool:
        """Each app container gets its own GPUs (``container_gpus`` given), not all of them."""
        return bool(self.container_gpus)

    def __hash__(self) -> int:
        # ``identity`` and ``container_gpus`` are dicts (JSON objects): hashed by their items.
        identity = tuple(sorted(self.identity.items()))
        gpus = tuple(sorted(self.container_gpus.items()))
        key = (self.actor_id, self.seq, self.at, self.bundle, self.containers, self.runsc)
        return hash((*key, *identity, *gpus))

    def __post_init__(self) -> None:
        for name, given in (
            ("container_gpus", bool(self.container_gpus)),
            ("runsc", bool(self.runsc)),
        ):
            if self.v < 4 and given:
                raise errors.EventFieldError(
                    f"actor_registered for {self.actor_id!r}: {name} needs v 4 "
                    f"(this line is v {self.v})",
                    name,
                )
        if self.runsc and not (self.runsc.startswith("/") and self.containers):
            problem = (
                "is not an absolute path"
                if not self.runsc.startswith("/")
                else "needs containers: only a sandbox runs under a runsc of its own"
            )
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: runsc {self.runsc!r} {problem}",
                "runsc",
            )
        if self.v < 3:
            for name, value in (("containers", self.containers), ("identity", self.identity)):
                if value:
                    raise errors.EventFieldError(
                        f"actor_registered for {self.actor_id!r}: {name} needs v 3 "
                        f"(this line is v {self.v})",
                        name,
                    )
        seen: set[str] = set()
        for i, container in enumerate(self.containers):
            if container == PAUSE_CONTAINER:
                problem = f"{PAUSE_CONTAINER} is the sandbox's root container, always implied"
            elif not CONTAINER_NAME.fullmatch(container):
                problem = (
                    f"it must match {CONTAINER_NAME.pattern} (letters, digits, '_', '.', "
                    "'-'; 1-63 characters): it names a runsc container and a bundle directory"
                )
            elif container in seen:
                problem = "it is named twice"
            else:
                seen.add(container)
                continue
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: container name {container!r}: {problem}",
                f"containers[{i}]",
            )
        if self.gpus and self.gpu_names:
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: give gpus ({self.gpus}) or "
                f"gpu_names ({', '.join(self.gpu_names)}), not both",
                "gpu_names",
            )
        for i, name in enumerate(self.gpu_names):
            if "/" not in name or "=" not in name:
                raise errors.EventFieldError(
                    f"actor_registered for {self.actor_id!r}: gpu_names must be fully "
                    f"qualified CDI names (vendor/class=name), got {name!r}",
                    f"gpu_names[{i}]",
                )
        self._check_container_gpus()
        if self.suspend_policy not in SUSPEND_POLICIES:
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: unknown suspend_policy "
                f"{self.suspend_policy!r} (expected one of {', '.join(SUSPEND_POLICIES)})",
                "suspend_policy",
            )

    def _check_container_gpus(self) -> None:
        """Every key an app container, every list non-empty and without repeats, and the
        names together exactly ``gpu_names``."""
        if not self.container_gpus:
            return
        where = f"actor_registered for {self.actor_id!r}: container_gpus"
        union: dict[str, None] = {}
        for container, names in self.container_gpus.items():
            field = f"container_gpus.{container}"
            if container not in self.containers:
                raise errors.EventFieldError(
                    f"{where}: {container!r} is not one of the app containers "
                    f"({', '.join(self.containers) or 'none'})",
                    field,
                )
            if not names:
                raise errors.EventFieldError(
                    f"{where}: {container!r} lists no GPU (leave a container with none out)",
                    field,
                )
            if len(set(names)) != len(names):
                raise errors.EventFieldError(f"{where}: {container!r} names a GPU twice", field)
            for i, name in enumerate(names):
                if "/" not in name or "=" not in name:
                    raise errors.EventFieldError(
                        f"{where}: {container!r}: not a fully qualified CDI name "
                        f"(vendor/class=name): {name!r}",
                        f"{field}[{i}]",
                    )
                union.setdefault(name)
        if set(union) != set(self.gpu_names):
            raise errors.EventFieldError(
                f"{where}: the containers' GPUs ({', '.join(union)}) are not gpu_names "
                f"({', '.join(self.gpu_names) or 'none'}): the sandbox's GPUs are their union",
                "gpu_names",
            )


@register
class BundlePrepared(Event, frozen=True, tag="bundle_prepared"):
    """The actor's OCI bundle is (re-)unpacked and ready."""

    bundle: str
    """The bundle directory (may differ from the registered one)."""


@register
class RunRequested(Event, frozen=True, tag="run_requested"):
    """Run the actor from its bundle (inject, create, start)."""


@register
class SuspendRequested(Event, frozen=True, tag="suspend_requested"):
    """Checkpoint the actor and stop its sandbox.

    Version 2: ``image_path`` chooses the checkpoint's directory. A v1 line has
    none (the checkpoint goes where it always went); one that carries it is refused.
    """

    v: Literal[1, 2] = 2  # type: ignore[assignment]  # reads v1 and v2 (see above)
    image_path: str | None = None
    """Write the checkpoint into this directory (absolute; it must not already hold a
    checkpoint) instead of ``<checkpoint_root>/<actor>/<seq>``: it becomes the actor's
    checkpoint."""

    def __post_init__(self) -> None:
        if self.image_path is None:
            return
        if self.v < 2:
            raise errors.EventFieldError(
                f"suspend_requested for {self.actor_id!r}: image_path needs v 2 "
                f"(this line is v {self.v})",
                "image_path",
            )
        if not self.image_path.startswith("/") or "\x00" in self.image_path:
            raise errors.EventFieldError(
                f"suspend_requested for {self.actor_id!r}: image_path must be an absolute "
                f"directory path, got {self.image_path!r}",
                "image_path",
            )


@register
class RestoreRequested(Event, frozen=True, tag="restore_requested"):
    """Restore the actor from a checkpoint (its last one, or ``image_path``)."""

    image_path: str | None = None
    """The checkpoint to restore (from another worker); default: the actor's last one."""
    worker: str | None = None
    """The worker the checkpoint was taken on, when not this one (informational)."""


@register
class RetryRequested(Event, frozen=True, tag="retry_requested"):
    """Recover a failed actor: from its last good checkpoint, else from its bundle."""


@register
class DeleteRequested(Event, frozen=True, tag="delete_requested"):
    """Delete the actor's sandbox and forget the actor."""


@register
class CudaContextOpened(Event, frozen=True, tag="cuda_context_opened"):
    """A process of the actor's sandbox opened a CUDA context."""

    pid: int = 0
    """The process inside the sandbox, when known."""


@register
class CudaContextClosed(Event, frozen=True, tag="cuda_context_closed"):
    """A CUDA context of the actor's sandbox was closed."""

    pid: int = 0
    """The process inside the sandbox, when known."""


@register
class SandboxExited(Event, frozen=True, tag="sandbox_exited"):
    """The actor's sandbox exited on its own."""

    status: int = 0
    """The exit status of the container's init process."""

    def describe(self) -> str:
        return f"sandbox exited with status {self.status}"
