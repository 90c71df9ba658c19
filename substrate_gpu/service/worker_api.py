"""The worker API door: ``ateworker.Worker`` over gRPC, onto the same machine and event log.

``substrate-gpu agent --worker-socket PATH`` serves agent-substrate's worker API (the
``.proto`` in :mod:`substrate_gpu.service.ateworker`) with grpcio's asyncio server, on the
agent's own event loop. Each call becomes events submitted through the same
:meth:`AgentService.offer` as a JSON line: the same machine decides, the same log records,
``client actors`` shows the same actors. docs/worker-api.md is the contract.

Here are the calls (:class:`WorkerService`); beside them, :mod:`.worker_grpc` serves them on
the socket (statuses, bounds, reflection), :mod:`.worker_calls` holds one call's plumbing
(its error, the per-UID lock, the runsc it names), :mod:`.worker_durable` the durable-dir
volumes, :mod:`.worker_requests` the checks of a request's fields and files,
:mod:`.worker_stats` the samples, :mod:`.worker_shutdown` the app containers at SIGTERM.
In short:

- **One activation, one actor.** ``deleted`` is final, and atelet runs, checkpoints and
  restores one actor UID again and again, so each Run or Restore registers a new actor
  ``<actor_uid>.<n>`` (n = 1, 2, ...). The request's identity (atespace, names, template, the
  activation's start) is kept on the actor (``ActorRegistered.identity``): it is in the log,
  so a restarted agent still knows which actor is which UID's.
- **Run** registers the sandbox (``_pause`` + the request's app containers, bundles in
  ``actor_dirs.oci_bundle_dir``, composed and sized first), then ``run_requested`` (the
  three durable together: one fsync), and answers once the actor is ``running`` and that
  is durable; **Checkpoint** (FULL) is ``suspend_requested`` into ``actor_dirs.checkpoint_dir``
  then ``delete_requested`` (the workload is torn down, as upstream); **Restore** (FULL)
  registers a new activation and ``restore_requested`` from ``actor_dirs.restore_dir``;
  **Terminate** is ``delete_requested`` (app containers first, ``_pause`` last: the delete
  effect's order), and succeeds when nothing is left, so a repeat is a no-op.
- **An actor that rests anywhere but where the call wanted** answers with the machine's
  reason: ``FAILED_PRECONDITION`` for a refusal (a live CUDA context with no suspend route: the
  actor keeps running), ``INTERNAL`` for a runtime failure; a Run or Restore that failed
  deletes its activation, so a failed call leaves no sandbox behind.
- **An abandoned Run or Restore is undone** (its caller's deadline passed, or it cancelled):
  the call runs in a task of the worker's own (:meth:`WorkerService.open`), not in the
  handler grpc cancels, so it is never cut short between two of its steps. Abandoning it
  stops it at the step it is in (an effect in flight finishes, bounded by its timeout: a
  runsc command is never killed half-way), then deletes the activation it registered,
  before the UID's lock is released: the next call of the UID finds nothing of it.
- **Stats never wait.** They read the actor table and the sandbox's cgroup, never the
  per-UID lock the lifecycle calls hold (:mod:`.worker_stats`).
- **Draining**: after SIGTERM a Run or Restore is answered ``UNAVAILABLE``, so atelet places
  the actor on another worker; a Checkpoint or Terminate is still served (upstream's worker
  lets an actor suspend while its pod shuts down), and so are stats.
  :meth:`WorkerService.shutdown` then does what upstream's ``gracefulShutdown`` does: the
  lifecycle calls in flight finish (a checkpoint saves its actor), then every app container
  of every running sandbox gets SIGTERM, and SIGKILL at the one deadline
  (``--workload-grace``; :mod:`.worker_shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import grpc
import grpc.aio

from substrate_gpu import _blocking, _defaults, _private
from substrate_gpu._log import get_logger
from substrate_gpu.injection import devices
from substrate_gpu.lifecycle import actors, errors, events, hooks, sandbox
from substrate_gpu.rootfs import overlay
from substrate_gpu.runsc import api as runsc_api
from substrate_gpu.service import (
    activations,
    actor_log,
    cgroup_stats,
    durable_dirs,
    protocol,
    wakeup,
    worker_calls,
    worker_durable,
    worker_requests,
    worker_shutdown,
    worker_stats,
)
from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.service.worker_calls import CallError

log = get_logger(__name__)
_T = TypeVar("_T")

SERVICE: Final = pb.DESCRIPTOR.services_by_name["Worker"]
"""``ateworker.Worker`` as our .proto describes it: the methods served."""

#: The identity fields every request carries, kept on the actor and echoed in samples.
IDENTITY_FIELDS: Final = worker_requests.IDENTITY_FIELDS
#: Outcomes that are a refusal (the machine or the node said no; nothing broke).
REFUSALS: Final = frozenset(
    {
        "checkpoint_refused",
        "cuda_suspend_refused",
        "preflight_refused",
        "restore_refused",
        "gpus_refused",
        "gpus_unavailable",
    }
)
#: Where a probe reaches a sandbox on the worker pod's network (``--sandbox-network pod``).
POD_ADDRESS: Final = "127.0.0.1"
#: How long Terminate waits for an effect another door started to finish before deleting.
SETTLE_TIMEOUT: Final = 600.0
#: The calls that change an actor (the ones shutdown waits for).
LIFECYCLE_CALLS: Final = frozenset(
    {"RunWorkload", "RestoreWorkload", "CheckpointWorkload", "TerminateWorkload"}
)
#: How long a closing worker lets the calls still in it answer before cancelling them.
CLOSE_GRACE: Final = 1.0


class WorkerService:
    """The ``ateworker.Worker`` methods, on the agent's ``AgentService``."""

    def __init__(
        self,
        service: worker_calls.Door,
        *,
        runsc: str,
        dev_root: Path = Path("/"),
        cgroup_root: Path = cgroup_stats.CGROUP_ROOT,
        max_actors: int = _defaults.MAX_ACTORS,
        image_layers_dir: Path = overlay.DEFAULT_LAYERS_DIR,
        runtime: runsc_api.SandboxRuntime | None = None,
        runsc_static_dir: Path = _defaults.RUNSC_STATIC_DIR,
        actor_logs: actor_log.ActorLogs | None = None,
        sandbox_network: str | None = None,
    ) -> None:
        """``dev_root``: where a GPU worker's device nodes are (each actor gets all GPUs);
        ``cgroup_root``: where the sandboxes' cgroups are read; ``max_actors``: the UIDs
        hosted at once (``--max-actors``); ``image_layers_dir``: where the cached image
        layers a bundle's ``rootfs-overlay.json`` names must lie (``--image-layers-dir``);
        ``runtime``: the agent's sandbox runtime, through which :meth:`shutdown` signals app
        containers (None: it signals none); ``runsc_static_dir``: where atelet stages the
        runsc a request's ``runsc_path`` names (``--runsc-static-dir``); ``actor_logs``: the
        app containers' output forwarding, told here which sandbox is which actor's (its
        identity labels); ``sandbox_network``: ``pod`` when sandboxes run on the worker pod's
        network namespace (``--sandbox-network``: the bundles lose theirs)."""
        self._pod_network = sandbox_network == "pod"
        self._service = service
        self._agent = service.agent
        self._runsc = worker_calls.RunscBinary(runsc)
        self._static_dir = runsc_static_dir
        self._gpu_worker = devices.has_gpu(dev_root)
        self._activations = activations.Activations(self._agent)
        """Live activations per UID, kept as transitions happen (O(live), not O(actors))."""
        self._stats = worker_stats.Stats(self._agent, self._activations.is_live, cgroup_root)
        self._composed: dict[str, bool] = {}
        """Whether the rootfs of an activation this agent prepared was composed (mounted)."""
        self._locks = worker_calls.UidLocks()
        self._max_actors = max_actors
        self._admitting: set[str] = set()
        self._layers_dir = image_layers_dir
        self._runtime = runtime
        self._detached: set[asyncio.Future[Any]] = set()
        """Work a caller may leave, kept referenced until it ends (:meth:`_not_cancelled`)."""
        self.in_flight: dict[int, str] = {}
        """Lifecycle calls being answered (a token each), for :meth:`shutdown` to wait on."""
        self._calls: dict[str, worker_calls.Call] = {}
        """The Run or Restore in flight per UID (at most one: the UID's lock)."""
        self._tasks: anyio.abc.TaskGroup | None = None
        if actor_logs is not None:
            actor_logs.identify = self._identity_of
        self.draining = False
        """Set on SIGTERM: Run and Restore are answered UNAVAILABLE from then on."""

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[WorkerService]:
        """Serve calls from a task group of the worker's own while inside
        (:meth:`hosted_in`)."""
        async with anyio.create_task_group() as tasks:
            with self.hosted_in(tasks):
                yield self

    @contextlib.contextmanager
    def hosted_in(self, tasks: anyio.abc.TaskGroup) -> Iterator[WorkerService]:
        """Run and Restore run in ``tasks`` while inside (see the module doc), a task group
        entered before the agent, as the worker door outlives the agent's drain. On leaving,
        what is still in it gets :data:`CLOSE_GRACE` seconds to answer (the agent has
        drained by then: each call fails fast) and is then cancelled: the event log tells
        the next agent where each actor rests."""
        self._tasks = tasks
        try:
            yield self
        finally:
            self._tasks = None
            tasks.cancel_scope.deadline = anyio.current_time() + CLOSE_GRACE

    # --- the calls ---------------------------------------------------------------------------

    async def RunWorkload(self, request: pb.RunWorkloadRequest) -> pb.RunWorkloadResponse:
        """Register a new activation of the sandbox and run it; OK once it is running."""
        uid = self._begin(request, startup=True)
        durable = worker_durable.mounts_of(request.spec)
        probes = self._probes(request.spec)
        workload = await self._workload(request.actor_dirs.oci_bundle_dir, request.spec)
        workload = self._staged(workload, request.runsc_path)

        def boot(actor_id: str) -> events.Event:
            return events.RunRequested(actor_id=actor_id)

        async def run(call: worker_calls.Call) -> None:
            actor_id = await self._activate(call, request, workload, durable, boot=boot, what="run")
            await self._woken(actor_id, probes)

        await self._startup(uid, "RunWorkload", run)
        return pb.RunWorkloadResponse()

    async def RestoreWorkload(
        self, request: pb.RestoreWorkloadRequest
    ) -> pb.RestoreWorkloadResponse:
        """Register a new activation from ``actor_dirs.restore_dir``: its durable-dir
        volumes extracted first, then (FULL) restored from the image or (DATA) booted
        afresh on them."""
        uid = self._begin(request, startup=True)
        scope = self._scope(request.scope)
        durable = worker_durable.mounts_of(request.spec)
        probes = self._probes(request.spec)
        workload = await self._workload(request.actor_dirs.oci_bundle_dir, request.spec)
        image = worker_requests.check_dir(request.actor_dirs.restore_dir, "actor_dirs.restore_dir")
        if scope == pb.SNAPSHOT_SCOPE_FULL and not (image / "checkpoint.img").is_file():
            raise worker_requests.BadRequest(
                f"actor_dirs.restore_dir {str(image)!r} holds no checkpoint.img"
            )
        workload = self._staged(workload, request.runsc_path)

        def boot(actor_id: str) -> events.Event:
            if scope == pb.SNAPSHOT_SCOPE_DATA:
                # Upstream's DATA restore is a cold boot on the restored volumes.
                return events.RunRequested(actor_id=actor_id)
            # runsc restore only reads the image: restore_dir is left as it is whether or
            # not preserve_restore_dir is set (tests/runsc/test_real_worker_api.py).
            return events.RestoreRequested(actor_id=actor_id, image_path=str(image))

        async def restore(call: worker_calls.Call) -> None:
            actor_id = await self._activate(
                call, request, workload, durable, boot=boot, what="restore", restore_from=image
            )
            await self._woken(actor_id, probes)

        await self._startup(uid, "RestoreWorkload", restore)
        return pb.RestoreWorkloadResponse()

    async def CheckpointWorkload(
        self, request: pb.CheckpointWorkloadRequest
    ) -> pb.CheckpointWorkloadResponse:
        """Snapshot the running sandbox into ``actor_dirs.checkpoint_dir``, then tear it
        down; the files written there. FULL: runsc's checkpoint, then a tar of each
        durable-dir volume; DATA: the sandbox paused, the tars written, the sandbox resumed
        (whatever the call's deadline), as upstream's worker does."""
        uid = self._begin(request)
        scope = self._scope(request.scope)
        durable = worker_durable.mounts_of(request.spec)
        volumes = durable_dirs.volume_names(durable)
        if scope == pb.SNAPSHOT_SCOPE_DATA and not volumes:
            raise worker_requests.BadRequest(
                "scope SNAPSHOT_SCOPE_DATA: no container of spec mounts a durable-dir volume, "
                "so there is no data to snapshot"
            )
        return await self._not_cancelled(
            "CheckpointWorkload", self._checkpoint(uid, scope, volumes, request)
        )

    async def _checkpoint(
        self,
        uid: str,
        scope: int,
        volumes: tuple[str, ...],
        request: pb.CheckpointWorkloadRequest,
    ) -> pb.CheckpointWorkloadResponse:
        """The checkpoint itself, under the UID's lock (see :meth:`CheckpointWorkload`)."""
        directory = request.actor_dirs.checkpoint_dir
        volumes_dir = Path(request.actor_dirs.durable_dir_volume_mounts_dir)
        async with self._locks.held(uid):
            view = self._live(uid)
            if view is None:
                raise CallError(grpc.StatusCode.NOT_FOUND, f"this worker is not executing {uid!r}")
            if view.state != "running":
                raise CallError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"actor {uid!r} (here {view.actor_id!r}) is {view.state!r}, not running: "
                    "only a running workload is checkpointed",
                )
            try:
                # 0700 when made here; atelet's own directory keeps its mode (the files
                # runsc writes in it are 0600 whatever it is: substrate_gpu._private).
                await _blocking.run_abandonable(
                    functools.partial(_private.make_private_dirs, Path(directory)),
                    name="substrate-gpu checkpoint dir",
                )
            except OSError as e:
                raise worker_requests.BadRequest(
                    f"actor_dirs.checkpoint_dir {directory!r} cannot be made: {e.strerror or e}"
                ) from e
            # Not cancellable, as upstream's: a caller that gives up leaves the snapshot
            # and the teardown to finish (a DATA pause is always resumed).
            with anyio.CancelScope(shield=True):
                failure: CallError | None = None
                data_files: list[str] = []
                if scope == pb.SNAPSHOT_SCOPE_DATA:
                    data_files = await worker_durable.snapshot_data(
                        self._runtime, view.actor_id, volumes_dir, Path(directory), volumes
                    )
                else:
                    suspend = events.SuspendRequested(actor_id=view.actor_id, image_path=directory)
                    # Not answered on: the teardown's delete makes checkpoint_written
                    # durable with its own request (one fsync: the pipeline does not wait
                    # for it, recovery derives it again; docs/event-log.md).
                    await self._reach(
                        view.actor_id,
                        suspend,
                        "suspended",
                        "checkpoint",
                        cleanup=False,
                        answered=False,
                    )
                    if volumes:
                        # The sandbox is checkpointed (stopped): its volumes hold still.
                        try:
                            data_files = await worker_durable.archive(
                                volumes_dir, Path(directory), volumes
                            )
                        except CallError as e:
                            failure = e
                try:
                    # The workload is torn down after its snapshot, as upstream's worker does.
                    await self._delete(view.actor_id)
                except CallError as e:
                    log.warning("delete after checkpoint failed", actor=view.actor_id, error=str(e))
            if failure is not None:
                raise failure
        files = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
        return pb.CheckpointWorkloadResponse(snapshot_files=files, data_snapshot_files=data_files)

    async def TerminateWorkload(
        self, request: pb.TerminateWorkloadRequest
    ) -> pb.TerminateWorkloadResponse:
        """Delete every live activation of the UID; OK when there is none (idempotent)."""
        uid = self._begin(request)
        async with self._locks.held(uid):
            while (view := self._live(uid)) is not None:
                await self._delete(view.actor_id)
        return pb.TerminateWorkloadResponse()

    async def GetWorkloadStats(
        self, request: pb.GetWorkloadStatsRequest
    ) -> pb.GetWorkloadStatsResponse:
        """The sample of the UID's live activation; NOT_FOUND when it has none here."""
        uid = worker_requests.check_uid(request.actor_uid)
        view = self._live(uid)
        if view is None:
            raise CallError(grpc.StatusCode.NOT_FOUND, f"this worker is not executing {uid!r}")
        (sample,) = await self._stats.samples([view])
        if sample.source == pb.STATS_SOURCE_UNSPECIFIED:
            # Upstream's answer while a boot has not made the sandbox's cgroup yet (or a
            # teardown removed it): "no numbers right now", take the next sample.
            raise CallError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no sandbox cgroup to measure yet: actor {uid!r} (here {view.actor_id!r}) "
                f"is {view.state!r}",
            )
        return pb.GetWorkloadStatsResponse(sample=sample)

    async def GetActiveWorkloadStats(
        self, request: pb.GetActiveWorkloadStatsRequest
    ) -> pb.GetActiveWorkloadStatsResponse:
        """A sample per live activation (empty: this worker executes nothing)."""
        found = (self._agent.actor(a) for a in self._activations.all_live())
        views = [v for v in found if v is not None]
        return pb.GetActiveWorkloadStatsResponse(samples=await self._stats.samples(views))

    # --- Run and Restore: abandonable, undone when abandoned ----------------------------------

    async def _startup(
        self, uid: str, name: str, body: Callable[[worker_calls.Call], Awaitable[None]]
    ) -> None:
        """``body`` under the UID's lock, in the worker's own task group; this caller
        waits for it. If the caller goes away first (grpc cancels the handler on a deadline
        or a cancel), the call is abandoned: it stops at the step it is in and undoes what
        it made before the lock is released (upstream's worker cancels the call's context,
        and its deferred clean-up deletes the containers and unhosts the actor)."""
        tasks = self._tasks
        if tasks is None:
            raise CallError(
                grpc.StatusCode.UNAVAILABLE, f"{name}: the worker is not serving calls yet"
            )
        call = worker_calls.Call(uid, name)
        done = anyio.Event()
        failure: list[BaseException] = []
        finished: list[bool] = []

        async def run() -> None:
            try:
                await self._held_call(call, body)
                finished.append(True)
            except Exception as e:  # noqa: BLE001 (re-raised in the caller's task below)
                failure.append(e)
            finally:
                done.set()

        tasks.start_soon(run, name=f"worker {name} {uid}")
        try:
            await done.wait()
        finally:
            if not done.is_set():
                log.info("worker call abandoned by its caller: undoing it", call=name, uid=uid)
                call.abandon()
        if failure:
            raise failure[0]
        if not finished and not call.abandoned:
            # Cancelled from outside the call: the agent's drain gave up on it (SIGTERM), or
            # the worker is closing.
            self._not_draining()
            raise CallError(
                grpc.StatusCode.UNAVAILABLE,
                f"{name} of {uid!r}: the worker stopped before it finished; its state is in "
                "the event log for the next agent to reconcile",
            )
        if call.abandoned:
            # Abandoned by the worker itself (its caller would not be waiting otherwise).
            self._not_draining()
            raise CallError(grpc.StatusCode.ABORTED, f"{name} of {uid!r} was abandoned: undone")

    async def _held_call(
        self, call: worker_calls.Call, body: Callable[[worker_calls.Call], Awaitable[None]]
    ) -> None:
        async with contextlib.AsyncExitStack() as held:
            with call.scope:
                await held.enter_async_context(self._locks.held(call.uid))
            if call.abandoned:
                return  # while waiting for the lock: nothing was made
            # No await since the check: abandon() cancels this scope from here on.
            self._calls[call.uid] = call
            call.scope = anyio.CancelScope()  # the first one is spent (it was entered)
            try:
                with call.scope:
                    await body(call)
            finally:
                del self._calls[call.uid]
                if call.was_abandoned():
                    # Outside the call's cancelled scope, still under the UID's lock; the
                    # worker's task group (cancelled when the worker closes) still ends it.
                    await self._undo(call)

    async def _undo(self, call: worker_calls.Call) -> None:
        """Delete the activation an abandoned call registered (waiting out the effect in
        flight), so the UID is left as if the call never came; logged, never raised."""
        if call.made is None:
            return
        try:
            await self._delete(call.made)
        except CallError as e:
            log.warning(
                "undoing an abandoned call failed", call=call.name, actor=call.made, error=e.message
            )
        else:
            log.info("abandoned call undone", call=call.name, actor=call.made)

    def abandon_startups(self) -> list[str]:
        """Abandon every Run and Restore in flight (each undoes what it made); the UIDs
        (upstream's ``cancelStartups`` on SIGTERM)."""
        for call in self._calls.values():
            call.abandon()
        return sorted(self._calls)

    # --- the machine ------------------------------------------------------------------------

    async def _not_cancelled(self, call: str, work: Coroutine[Any, Any, _T]) -> _T:
        """``work`` in an asyncio task of its own, awaited. grpc.aio cancels a call's task
        natively when its caller gives up (a deadline, a cancel), which no anyio shield
        stops; here the caller stops waiting and ``work`` runs to its end (a checkpoint is
        not cancellable, as upstream's: a paused sandbox is always resumed). Counted in
        flight until it ends, so :meth:`shutdown` waits for it."""
        task = asyncio.ensure_future(work)
        self._detached.add(task)
        self.in_flight[id(task)] = call

        def finished(done: asyncio.Future[_T]) -> None:
            self._detached.discard(done)
            self.in_flight.pop(id(done), None)
            if not done.cancelled() and (error := done.exception()) is not None:
                log.info("worker call finished after its caller left", call=call, error=str(error))

        task.add_done_callback(finished)
        return await asyncio.shield(task)

    def _begin(self, request: worker_calls.LifecycleRequest, *, startup: bool = False) -> str:
        """The checks every lifecycle call starts with: not draining (a ``startup``, Run or
        Restore, only: a Checkpoint or Terminate is served while draining, as upstream's
        worker serves them), the UID, every ``actor_dirs`` field and ``runsc_path``
        (upstream validates the last two first of all, on Terminate too)."""
        if startup:
            self._not_draining()
        uid = worker_requests.check_uid(request.actor_uid)
        dirs = request.actor_dirs if request.HasField("actor_dirs") else None
        worker_requests.check_actor_dirs(dirs)
        if not request.runsc_path:
            raise worker_requests.BadRequest("runsc_path: Required value")
        if not self._runsc.is_ours(request.runsc_path):
            worker_requests.check_runsc_path(request.runsc_path, self._static_dir)
        return uid

    def _not_draining(self) -> None:
        if self.draining:
            raise CallError(
                grpc.StatusCode.UNAVAILABLE,
                "worker draining (SIGTERM): not accepting new workloads; retry on another worker",
            )

    @staticmethod
    def _scope(scope: int) -> int:
        """``scope`` when it is FULL or DATA (``SNAPSHOT_SCOPE_UNSPECIFIED`` is no scope)."""
        if scope not in (pb.SNAPSHOT_SCOPE_FULL, pb.SNAPSHOT_SCOPE_DATA):
            raise worker_requests.BadRequest(
                f"scope {scope} is not a snapshot scope: give SNAPSHOT_SCOPE_FULL or "
                "SNAPSHOT_SCOPE_DATA"
            )
        return scope

    @staticmethod
    def _probes(spec: pb.WorkloadSpec) -> tuple[wakeup.Probe, ...]:
        """The spec's wakeup probes, checked (INVALID_ARGUMENT naming a malformed one)."""
        try:
            return wakeup.check(spec.containers)
        except wakeup.ProbeError as e:
            raise worker_requests.BadRequest(str(e)) from e

    async def _woken(self, actor_id: str, probes: tuple[wakeup.Probe, ...]) -> None:
        """Once running: every probed container answered 200 (upstream's ``WaitAll``), on
        the worker pod's address; else the activation is deleted and the call fails. Without
        a sandbox network there is no address to probe: not awaited (logged)."""
        if not probes:
            return
        if not self._pod_network:
            log.warning(
                "wakeup probes not awaited: sandboxes have no network here "
                "(start the agent with --sandbox-network pod)",
                actor=actor_id,
                containers=[p.container for p in probes],
            )
            return
        try:
            await wakeup.wait_all(probes, POD_ADDRESS)
        except wakeup.ProbeError as e:
            with anyio.CancelScope(shield=True):
                try:
                    await self._delete(actor_id)
                except CallError as cleanup:
                    log.warning("cleanup after a failed probe failed", error=str(cleanup))
            raise CallError(
                grpc.StatusCode.INTERNAL, f"while waiting for container wakeup probe: {e}"
            ) from e

    def _staged(
        self, workload: worker_requests.Workload, runsc_path: str
    ) -> worker_requests.Workload:
        """``workload`` under the staged runsc ``runsc_path`` names (checked first)."""
        if self._runsc.is_ours(runsc_path):
            return workload  # the agent's own runsc: its runtime as it is
        staged = worker_requests.check_runsc_path(runsc_path, self._static_dir)
        return dataclasses.replace(workload, runsc=staged) if staged else workload

    async def _workload(self, bundle_dir: str, spec: pb.WorkloadSpec) -> worker_requests.Workload:
        names = [c.name for c in spec.containers]
        return await _blocking.run_abandonable(
            functools.partial(worker_requests.read_workload, bundle_dir, names),
            name="substrate-gpu read bundles",
        )

    def _identity_of(self, actor_id: str) -> dict[str, str] | None:
        """The request identity of activation ``actor_id``; None for another actor."""
        view = self._agent.actor(actor_id)
        if view is None or not activations.uid_of(view):
            return None
        return dict(view.identity)

    def _live(self, uid: str) -> actors.ActorView | None:
        """The UID's activation that is not deleted (the newest), or None (O(1))."""
        actor_id = self._activations.live(uid)
        return self._agent.actor(actor_id) if actor_id is not None else None

    def _not_executing(self, uid: str) -> None:
        view = self._live(uid)
        if view is not None:
            raise CallError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this worker already executes {uid!r} (actor {view.actor_id!r}, "
                f"{view.state!r}): checkpoint or terminate it first",
            )

    async def _activate(
        self,
        call: worker_calls.Call,
        request: pb.RunWorkloadRequest | pb.RestoreWorkloadRequest,
        workload: worker_requests.Workload,
        durable: tuple[durable_dirs.DurableMount, ...],
        *,
        boot: Callable[[str], events.Event],
        what: str,
        restore_from: Path | None = None,
    ) -> str:
        """Under the UID's lock: a new activation, booted (Run and Restore) until it runs.

        Its durable-dir volumes are bound (and, from ``restore_from``, extracted) and its
        bundles composed and edited first, before anything is registered; then its
        registration, its prepared bundle and ``boot`` (the run or restore request) are
        submitted as one group: durable with one fsync of the event log, before the first
        effect starts (each submitted alone cost a thread hop and an fsync wait)."""
        uid = call.uid
        self._not_draining()  # SIGTERM may have come while this call waited for the lock
        view = self._live(uid)
        if view is not None and view.state == "suspended":
            # Checkpointed and torn down, but its Checkpoint's caller left before the
            # activation was deleted (the teardown's last step): finish it.
            await self._delete(view.actor_id)
        self._not_executing(uid)
        with self._admitted(uid):
            actor_id = self._new_activation(uid)
            try:
                await worker_durable.prepare_volumes(
                    workload,
                    durable,
                    Path(request.actor_dirs.durable_dir_volume_mounts_dir),
                    restore_from,
                )
                # Not abandonable: a compose the caller gave up on finishes, and is undone
                # here (a thread left running would mount after the unmount).
                with anyio.CancelScope(shield=True):
                    cgroup = await self._prepare_bundles(workload, actor_id, request)
                self._stats.place(actor_id, cgroup)
                registration = self._registration(call, request, workload, actor_id)
            except BaseException:
                if call.made is None:
                    self._composed.pop(actor_id, None)
                    await self._unmount(workload.bundle_dir)
                raise
            try:
                await self._reach(actor_id, (*registration, boot(actor_id)), "running", what)
            except BaseException:
                if self._agent.actor(actor_id) is None:  # nothing was registered
                    self._composed.pop(actor_id, None)
                    await self._unmount(workload.bundle_dir)
                raise
        return actor_id

    async def _prepare_bundles(
        self,
        workload: worker_requests.Workload,
        actor_id: str,
        request: pb.RunWorkloadRequest | pb.RestoreWorkloadRequest,
    ) -> str:
        """In one thread hop: each container's rootfs composed as atelet's
        ``rootfs-overlay.json`` asks, before runsc creates it (upstream's
        ``imagecache.SetupBundleRootfs``; :mod:`..rootfs.overlay`), then every config edited
        once (:func:`~.worker_requests.edit_configs`: sized, placed in the sandbox, on the
        pod's network when asked); the sandbox's cgroup. Composing, sizing and the pod's
        network were a hop each."""
        containers = (sandbox.PAUSE, *workload.containers)

        def prepare() -> tuple[tuple[str, ...], str]:
            composed = overlay.compose_bundle(
                workload.bundle_dir, containers, layers_dir=self._layers_dir
            )
            cgroup = worker_requests.edit_configs(
                workload.bundle_dir,
                workload.containers,
                actor_id,
                request.cpu_milli,
                request.memory_bytes,
                pod_network=self._pod_network,
            )
            return composed, cgroup

        try:
            composed, cgroup = await _blocking.run_abandonable(
                prepare, name="substrate-gpu prepare bundles"
            )
        except overlay.OverlayError as e:
            if e.bad_input:
                raise worker_requests.BadRequest(str(e)) from e
            raise CallError(grpc.StatusCode.INTERNAL, str(e)) from e
        self._composed[actor_id] = bool(composed)
        if composed:
            log.info("rootfs composed", bundle=str(workload.bundle_dir), containers=composed)
        return cgroup

    async def _unmount(self, bundle_dir: Path) -> None:
        """Detach every mount under an activation's bundle directory (upstream's
        ``imagecache.UnmountAllUnder``): after Terminate, a checkpoint's teardown and a
        failed Run; a failure is logged, never the call's answer (the sandbox is gone)."""
        with anyio.CancelScope(shield=True):
            try:
                await _blocking.run_abandonable(
                    functools.partial(overlay.unmount_all_under, bundle_dir),
                    name="substrate-gpu unmount rootfs",
                )
            except OSError as e:
                log.warning("rootfs unmount failed", bundle=str(bundle_dir), error=str(e))

    @contextlib.contextmanager
    def _admitted(self, uid: str) -> Iterator[None]:
        """Hold the UID's slot while inside, or refuse as upstream's worker does when it is
        full. A slot is held from here until the activation is deleted (it is live from
        its registration on); UIDs being admitted count too, so concurrent Runs of
        different UIDs cannot overfill the worker (O(calls being admitted))."""
        admitting = sum(1 for u in self._admitting if not self._activations.is_hosted(u))
        if self._activations.hosted() + admitting >= self._max_actors:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"worker is full: {self._max_actors} actors"
            )
        self._admitting.add(uid)
        try:
            yield
        finally:
            self._admitting.discard(uid)

    def _new_activation(self, uid: str) -> str:
        """The id of the UID's next activation, ``<uid>.<n>`` (an id another door took is
        skipped)."""
        n = self._activations.next_number(uid)
        while self._agent.actor(f"{uid}.{n}") is not None:
            n += 1
        return f"{uid}.{n}"

    def _registration(
        self,
        call: worker_calls.Call,
        request: pb.RunWorkloadRequest | pb.RestoreWorkloadRequest,
        workload: worker_requests.Workload,
        actor_id: str,
    ) -> tuple[events.Event, events.Event]:
        """The events that register activation ``actor_id`` with its prepared bundle."""
        call.made = actor_id  # before it exists: an abandoned call deletes it if it does
        identity = {name: getattr(request, name) for name in IDENTITY_FIELDS}
        identity[worker_stats.EPOCH_KEY] = str(time.time_ns())
        gpu = bool(workload.gpu_names) or self._gpu_worker
        bundle = str(workload.bundle_dir)
        if not workload.containers:
            # ``_pause`` alone (upstream boots it and no app): a one-container sandbox, the
            # machine's single-container actor on ``_pause``'s bundle. No app, no GPU.
            gpu, bundle = False, str(workload.bundle_dir / worker_requests.PAUSE)
        return (
            events.ActorRegistered(
                actor_id=actor_id,
                gpu=gpu,
                bundle=bundle,
                gpu_names=workload.gpu_names,
                containers=workload.containers,
                container_gpus=dict(workload.container_gpus),
                runsc=workload.runsc,
                identity=identity,
            ),
            events.BundlePrepared(actor_id=actor_id, bundle=bundle),
        )

    async def _submit(self, event: events.Event) -> hooks.Transition:
        accepted = await self._service.offer(event)
        if isinstance(accepted, protocol.RequestError):
            self._service.reject(accepted, 0)
            raise CallError(worker_calls.refusal_code(accepted), accepted.message)
        return accepted

    async def _submit_all(self, group: Sequence[events.Event]) -> list[hooks.Transition]:
        accepted = await self._service.offer_all(group)
        if isinstance(accepted, protocol.RequestError):
            self._service.reject(accepted, 0)
            raise CallError(worker_calls.refusal_code(accepted), accepted.message)
        return accepted

    async def _durable(self) -> None:
        """Before answering: every event accepted so far is durable (an observer, this door,
        may see a transition before its event is: docs/event-log.md)."""
        failed = await self._service.durable()
        if failed is not None:
            self._service.reject(failed, 0)
            raise CallError(worker_calls.refusal_code(failed), failed.message)

    async def _reach(
        self,
        actor_id: str,
        event: events.Event | Sequence[events.Event],
        goal: str,
        what: str,
        *,
        cleanup: bool = True,
        answered: bool = True,
    ) -> None:
        """Submit ``event`` (or a group, durable together, the last one the request) and wait
        until the actor rests; an error unless it rests in ``goal``. ``cleanup``: a failed
        activation is deleted before answering. ``answered``: the call answers on this rest,
        so it is durable first (False: a later submit of the call makes it durable)."""
        group = (event,) if isinstance(event, events.Event) else tuple(event)
        rested = await self._until_rest(actor_id, group)
        if answered:
            await self._durable()
        if rested.dest == goal:
            return
        view = self._agent.actor(actor_id)
        reason = (view.reason if view is not None else None) or rested.reason or rested.trigger
        refused = rested.trigger in REFUSALS or rested.source == rested.dest
        error = CallError(
            grpc.StatusCode.FAILED_PRECONDITION if refused else grpc.StatusCode.INTERNAL,
            f"{what} of actor {actor_id!r} {'refused' if refused else 'failed'}: it is "
            f"{rested.dest!r}: {reason}",
        )
        if cleanup:
            with anyio.CancelScope(shield=True):
                try:
                    await self._delete(actor_id)
                except CallError as e:
                    log.warning("cleanup after a failed call failed", actor=actor_id, error=str(e))
        raise error

    async def _until_rest(self, actor_id: str, group: Sequence[events.Event]) -> hooks.Transition:
        """Submit ``group`` (the last event is the request); the transition that left the
        actor in a state with no effect."""
        in_flight = self._agent.spec.effects
        async with self._agent.subscribe(buffer=100_000) as transitions:
            if len(group) == 1:
                submitted = await self._submit(group[0])
            else:
                submitted = (await self._submit_all(group))[-1]
            if submitted.dest not in in_flight:
                return submitted
            ours = False
            try:
                async for t in transitions:
                    if t.actor_id != actor_id:
                        continue
                    if not ours:
                        # What came before our own event (another door's) is not its end.
                        ours = (t.event_type, t.at, t.dest) == (
                            submitted.event_type,
                            submitted.at,
                            submitted.dest,
                        )
                        continue
                    if t.dest not in in_flight:
                        return t
            except errors.SubscriptionOverflow:
                # Fell behind a very busy agent: read the actor's state instead.
                while (view := self._agent.actor(actor_id)) is not None:
                    if view.state not in in_flight:
                        return hooks.Transition(
                            actor_id=actor_id,
                            source="",
                            dest=view.state,
                            trigger="",
                            event_type="",
                            at=time.time(),
                            reason=view.reason,
                        )
                    await anyio.sleep(0.05)
        raise CallError(
            grpc.StatusCode.UNAVAILABLE,
            f"the agent stopped before actor {actor_id!r} finished; its state is in the event "
            "log for the next agent to reconcile",
        )

    async def _delete(self, actor_id: str) -> None:
        """Delete the actor (waiting out an effect in flight first), then detach the
        mounts under its bundle directory (its composed rootfs); an error if it fails."""
        await self._delete_sandbox(actor_id)
        view = self._agent.actor(actor_id)
        # An activation this agent prepared with nothing composed has nothing mounted (a
        # thread hop saved per teardown); one it did not prepare (an agent restarted on its
        # log) may have.
        if view is not None and view.bundle and self._composed.pop(actor_id, True):
            await self._unmount(Path(view.bundle))

    async def _delete_sandbox(self, actor_id: str) -> None:
        view = await self._settled(actor_id)
        if view is None or view.state == "deleted":
            return
        await self._reach(
            actor_id, events.DeleteRequested(actor_id=actor_id), "deleted", "delete", cleanup=False
        )

    async def release_stale_mounts(self) -> None:
        """At start: detach the composed rootfs of activations the event log says are
        deleted (an earlier agent was killed between the delete and the unmount, or the
        recovery deleted them), unless a live activation uses the same bundle directory."""
        views = [v for v in self._agent.actors() if activations.uid_of(v) and v.bundle]
        live = {v.bundle for v in views if v.state != "deleted"}
        stale = {v.bundle for v in views if v.state == "deleted"} - live
        if not stale:
            return
        table = await anyio.Path("/proc/self/mountinfo").read_text(errors="surrogateescape")
        for bundle in sorted(stale):
            if overlay.mount_points_under(bundle, table):
                log.info("detaching a deleted activation's rootfs", bundle=bundle)
                await self._unmount(Path(bundle))

    async def _settled(self, actor_id: str) -> actors.ActorView | None:
        """The actor once no effect of its is in flight (one another door or an abandoned
        call started runs to its end, bounded by its timeout), or None when unknown.

        Subscribed before the state is read, so the transition that ends the effect cannot
        fall between the read and the wait (the wait would then last until the timeout)."""
        in_flight = self._agent.spec.effects
        with anyio.move_on_after(SETTLE_TIMEOUT):
            async with self._agent.subscribe(buffer=100_000) as transitions:
                view = self._agent.actor(actor_id)
                if view is None or view.state not in in_flight:
                    return view
                try:
                    async for t in transitions:
                        if t.actor_id == actor_id and t.dest not in in_flight:
                            break
                except errors.SubscriptionOverflow:
                    while (view := self._agent.actor(actor_id)) is not None:
                        if view.state not in in_flight:
                            break
                        await anyio.sleep(0.05)
        return self._agent.actor(actor_id)

    # --- shutdown ------------------------------------------------------------------------------

    async def shutdown(self, grace: float) -> None:
        """Upstream's ``gracefulShutdown``, under one deadline ``grace`` seconds away: refuse new
        Runs and Restores (a Checkpoint or Terminate is still served), let those in flight finish
        (a checkpoint saves its actor; a Run or Restore goes on to where its effects take
        it), then stop every app container of every running sandbox
        (:func:`.worker_shutdown.stop_apps`: SIGTERM, SIGKILL at the deadline)."""
        self.draining = True
        deadline = anyio.current_time() + grace
        with anyio.move_on_after(grace):
            while self.in_flight:
                await anyio.sleep(worker_shutdown.EXIT_POLL)
        if self.in_flight:
            log.error(
                "giving up waiting for in-flight worker calls at shutdown",
                calls=sorted(self.in_flight.values()),
            )
        await worker_shutdown.stop_apps(self._agent, self._runtime, deadline, self._submit)
