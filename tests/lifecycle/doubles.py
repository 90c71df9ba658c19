"""In-process doubles for the lifecycle's effects, faithful to the Protocols and typed errors.

``FakeRuntime`` keeps gVisor's documented behaviour where the lifecycle depends on it:
checkpointing with a live CUDA context fails with runsc's message; without
``--leave-running`` that failure stops the sandbox and a second attempt reports the
container "in state stopped"; a successful checkpoint without ``--leave-running`` stops it.
Live contexts are the "world": the probe double reads them, as the fd scanner would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.lowlevel

from substrate_gpu.probes.api import GpuClient
from substrate_gpu.runsc import api as runsc


def _error(cls: type[runsc.RunscError], argv: tuple[str, ...], message: str) -> runsc.RunscError:
    return cls(
        f"while running {' '.join(argv)}: runsc exited with status 1; stderr: {message}",
        argv=argv,
        returncode=1,
        stderr=message,
    )


@dataclass
class _Container:
    status: runsc.ContainerStatus
    pid: int
    bundle: str
    nvproxy: bool


@dataclass
class FakeRuntime:
    """A recording ``SandboxRuntime``."""

    leave_running: bool = True
    restore_creates_gpu_device_files: bool | None = None
    """What the binary scan would say about google/gvisor#14525 (None: cannot tell)."""
    calls: list[tuple[object, ...]] = field(default_factory=list)
    containers: dict[str, _Container] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    """Open CUDA contexts per container (the world)."""
    hang: set[str] = field(default_factory=set)
    """Operations (``create``, ``checkpoint``, ...) that never return."""
    fail: dict[str, str] = field(default_factory=dict)
    """Operations that fail with this stderr."""
    gates: dict[str, anyio.Event] = field(default_factory=dict)
    """Operations that wait for their event to be set before acting."""
    fail_on: dict[tuple[str, str], str] = field(default_factory=dict)
    """(operation, container id) pairs that fail with this stderr (a sandbox's one step)."""
    gates_on: dict[tuple[str, str], anyio.Event] = field(default_factory=dict)
    """(operation, container id) pairs that wait for their event (a sandbox's one step)."""
    root: str = ""
    """The actor whose own runsc root this runtime is (:meth:`for_actor`), or empty."""
    roots: dict[str, FakeRuntime] = field(default_factory=dict)
    """The per-actor runtimes handed out (their calls go to this runtime's ``calls``)."""
    removed_roots: list[str] = field(default_factory=list)
    """The actors whose own root was removed (:meth:`remove_root`), in order."""
    root_made: bool = False
    """A per-actor runtime's root exists: a create or restore ran under it since it was
    last removed (runsc makes its root on the first create)."""
    _next_pid: int = 1000

    def for_actor(self, actor_id: str) -> FakeRuntime:
        """The runtime under ``<root>/<actor_id>``: its own containers, the same recording
        (each call's argv starts with ``--root=<actor_id>``) and failure knobs."""
        child = self.roots.get(actor_id)
        if child is None:
            child = self.roots[actor_id] = FakeRuntime(
                leave_running=self.leave_running,
                restore_creates_gpu_device_files=self.restore_creates_gpu_device_files,
                calls=self.calls,
                hang=self.hang,
                fail=self.fail,
                gates=self.gates,
                fail_on=self.fail_on,
                gates_on=self.gates_on,
                root=actor_id,
                removed_roots=self.removed_roots,
            )
        return child

    def has_root(self) -> bool:
        return self.root_made

    async def remove_root(self) -> None:
        """Remove this actor's root; refused (an OSError) while a container is left in it:
        the record of a container that could not be deleted must stay."""
        if not self.root:
            raise ValueError("the worker's own root is never removed")
        await anyio.lowlevel.checkpoint()
        if self.containers:
            raise OSError(f"root {self.root} still holds {sorted(self.containers)}")
        self.root_made = False
        self.removed_roots.append(self.root)

    async def _enter(self, op: str, argv: tuple[str, ...]) -> None:
        if self.root:
            argv = (argv[0], f"--root={self.root}", *argv[1:])
        self.calls.append((op, *argv))
        await anyio.lowlevel.checkpoint()
        if op in self.hang:
            await anyio.sleep_forever()
        if op in self.gates:
            await self.gates[op].wait()
        if (op, argv[-1]) in self.gates_on:
            await self.gates_on[op, argv[-1]].wait()
        if op in self.fail:
            raise _error(runsc.RunscError, argv, self.fail[op])
        if (op, argv[-1]) in self.fail_on:
            raise _error(runsc.RunscError, argv, self.fail_on[op, argv[-1]])

    def _get(self, cid: str, argv: tuple[str, ...]) -> _Container:
        c = self.containers.get(cid)
        if c is None:
            raise _error(runsc.ContainerNotFoundError, argv, f"container {cid} does not exist")
        return c

    def _stop(self, cid: str) -> None:
        self.containers[cid].status = "stopped"
        self.containers[cid].pid = 0
        self.live.pop(cid, None)

    async def features(self) -> runsc.RunscFeatures:
        return runsc.RunscFeatures(
            version="runsc version fake",
            leave_running=self.leave_running,
            cuda_checkpoint_path=False,
            nvproxy_driver_version=False,
            list_supported_drivers=False,
            restore_creates_gpu_device_files=self.restore_creates_gpu_device_files,
        )

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        argv = ("runsc", *(["--nvproxy"] if nvproxy else []), "create", container_id)
        self.root_made = bool(self.root)
        await self._enter("create", argv)
        if container_id in self.containers:
            raise _error(
                runsc.ContainerExistsError, argv, f"container {container_id} already exists"
            )
        self._next_pid += 1
        self.containers[container_id] = _Container("created", self._next_pid, str(bundle), nvproxy)

    async def start(self, container_id: str) -> None:
        argv = ("runsc", "start", container_id)
        await self._enter("start", argv)
        c = self._get(container_id, argv)
        if c.status != "created":
            raise _error(runsc.RunscError, argv, f"cannot start container in state {c.status}")
        c.status = "running"

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        argv = (
            "runsc",
            "checkpoint",
            *(["--leave-running"] if leave_running else []),
            container_id,
        )
        await self._enter("checkpoint", argv)
        c = self._get(container_id, argv)
        if c.status == "stopped":
            raise _error(
                runsc.ContainerStoppedError,
                argv,
                f'cannot checkpoint container "{container_id}" in state stopped',
            )
        if self.live.get(container_id, 0):
            if not leave_running:
                self._stop(container_id)
            raise _error(
                runsc.LiveNvproxyClientsError,
                argv,
                "checkpoint failed: encoding error: can't save with live nvproxy clients",
            )
        image_path.mkdir(parents=True, exist_ok=True)
        (image_path / "checkpoint.img").write_text(container_id)
        if not leave_running:
            self._stop(container_id)

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        argv = ("runsc", *(["--nvproxy"] if nvproxy else []), "restore", container_id)
        await self._enter("restore", argv)
        created = self.containers.get(container_id)
        if created is not None and created.status != "created":
            raise _error(runsc.RunscError, argv, f"container {container_id} already exists")
        if not (image_path / "checkpoint.img").exists():
            raise _error(runsc.RunscError, argv, f"no checkpoint image in {image_path}")
        if created is not None:
            # A sandbox's containers are created, then restored in place (runsc's order).
            created.status = "running"
            return
        self._next_pid += 1
        self.containers[container_id] = _Container("running", self._next_pid, str(bundle), nvproxy)

    async def state(self, container_id: str) -> runsc.ContainerState:
        argv = ("runsc", "state", container_id)
        await self._enter("state", argv)
        c = self._get(container_id, argv)
        return runsc.ContainerState(id=container_id, status=c.status, pid=c.pid, bundle=c.bundle)

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        argv = ("runsc", "kill", container_id, signal)
        await self._enter("kill", argv)
        self._get(container_id, argv)
        self._stop(container_id)

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        argv = ("runsc", "delete", *(["--force"] if force else []), container_id)
        await self._enter("delete", argv)
        c = self._get(container_id, argv)
        if c.status == "running" and not force:
            raise _error(runsc.RunscError, argv, "cannot delete running container")
        del self.containers[container_id]
        self.live.pop(container_id, None)

    # --- the world ----------------------------------------------------------------------

    def open_context(self, container_id: str) -> None:
        """A process of the running sandbox opens a CUDA context."""
        assert self.containers[container_id].status == "running"
        self.live[container_id] = self.live.get(container_id, 0) + 1

    def exit_sandbox(self, container_id: str) -> None:
        """The sandbox's init process exits on its own."""
        self._stop(container_id)

    def close_context(self, container_id: str) -> None:
        """One CUDA context of the sandbox closes."""
        self.live[container_id] -= 1

    def ops(self, op: str) -> list[tuple[object, ...]]:
        """The recorded argv of every call of ``op``."""
        return [c[1:] for c in self.calls if c[0] == op]


@dataclass
class FakeProbe:
    """A ``CudaContextProbe`` that sees the runtime's world (``blind``: misses everything)."""

    runtime: FakeRuntime
    blind: bool = False
    calls: list[tuple[int, ...]] = field(default_factory=list)

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        self.calls.append(pids)
        if self.blind:
            return ()
        found: list[GpuClient] = []
        for cid, c in self.runtime.containers.items():
            if c.pid in pids:
                found.extend(
                    GpuClient(pid=c.pid, fd=10 + i, target="/dev/nvidiactl")
                    for i in range(self.runtime.live.get(cid, 0))
                )
        return tuple(found)


@dataclass
class FakeInjector:
    """A ``GpuInjector`` recording the bundles it injected into."""

    devices: int = 2
    error: Exception | None = None
    hang: bool = False
    calls: list[Path] = field(default_factory=list)
    """Per call, the bundle injected (``<bundle>/<container>`` for a sandbox's app)."""
    granted: list[tuple[str, ...] | None] = field(default_factory=list)
    """Per call, the devices asked for (``None``: all of the worker's)."""

    async def __call__(
        self, bundle: Path, *, devices: Sequence[str] | None = None, container: str | None = None
    ) -> int:
        self.calls.append(bundle if container is None else bundle / container)
        self.granted.append(None if devices is None else tuple(devices))
        await anyio.lowlevel.checkpoint()
        if self.hang:
            await anyio.sleep_forever()
        if self.error is not None:
            raise self.error
        return self.devices


@dataclass
class RecordingMetrics:
    """A ``LifecycleMetrics`` that records every call."""

    calls: list[tuple[object, ...]] = field(default_factory=list)

    def transition(self, source: str, dest: str, trigger: str) -> None:
        self.calls.append(("transition", source, dest, trigger))

    def checkpoint_refused(self, reason: str) -> None:
        self.calls.append(("checkpoint_refused", reason))

    def effect_finished(self, effect: str, outcome: str, seconds: float) -> None:
        self.calls.append(("effect_finished", effect, outcome))

    def devices_injected(self, count: int) -> None:
        self.calls.append(("devices_injected", count))

    def queue_depth(self, depth: int) -> None:
        self.calls.append(("queue_depth", depth))

    def named(self, name: str) -> list[tuple[object, ...]]:
        return [c[1:] for c in self.calls if c[0] == name]
