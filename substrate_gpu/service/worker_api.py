"""The worker API door: ``ateworker.Worker`` over gRPC, onto the same machine and event log.

``substrate-gpu agent --worker-socket PATH`` serves agent-substrate's worker API (the
``.proto`` in :mod:`substrate_gpu.service.ateworker`) with grpcio's asyncio server, on the
agent's own event loop. Each call becomes events submitted through the same
:meth:`AgentService.accept` as a JSON line: the same machine decides, the same log records,
``client actors`` shows the same actors. docs/worker-api.md is the contract; in short:

- **One activation, one actor.** ``deleted`` is final, and atelet runs, checkpoints and
  restores one actor UID again and again, so each Run or Restore registers a new actor
  ``<actor_uid>.<n>`` (n = 1, 2, ...). The request's identity (atespace, names, template, the
  activation's start) is kept on the actor (``ActorRegistered.identity``): it is in the log,
  so a restarted agent still knows which actor is which UID's.
- **Run** registers the sandbox (``_pause`` + the request's app containers, bundles in
  ``actor_dirs.oci_bundle_dir``), then ``run_requested``, and answers once the actor is
  ``running``; **Checkpoint** (FULL) is ``suspend_requested`` into ``actor_dirs.checkpoint_dir``
  then ``delete_requested`` (the workload is torn down, as upstream); **Restore** (FULL)
  registers a new activation and ``restore_requested`` from ``actor_dirs.restore_dir``;
  **Terminate** is ``delete_requested`` (app containers first, ``_pause`` last: the delete
  effect's order), and succeeds when nothing is left, so a repeat is a no-op.
- **An actor that rests anywhere but where the call wanted** answers with the machine's
  reason: ``FAILED_PRECONDITION`` for a refusal (a live CUDA context with no suspend route: the
  actor keeps running), ``INTERNAL`` for a runtime failure; a Run or Restore that failed
  deletes its activation, so a failed call leaves no sandbox behind.
- **Stats never wait.** They read the actor table and the sandbox's cgroup
  (:mod:`.cgroup_stats`), never the per-UID lock the lifecycle calls hold.
- **Draining**: after SIGTERM every lifecycle call is answered ``UNAVAILABLE`` (stats still
  answer) while the agent lets running effects finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import anyio
import grpc
import grpc.aio
import structlog
from google.protobuf import message

from substrate_gpu import _blocking, _defaults, _private, exceptions
from substrate_gpu.injection import devices
from substrate_gpu.lifecycle import Agent, actors, errors, events, hooks
from substrate_gpu.service import _socketfile, cgroup_stats, protocol, worker_requests
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

log = structlog.get_logger(__name__)

SERVICE: Final = pb.DESCRIPTOR.services_by_name["Worker"]
"""``ateworker.Worker`` as our .proto describes it: the methods served."""

#: The identity fields every request carries, kept on the actor and echoed in samples.
IDENTITY_FIELDS: Final = (
    "atespace",
    "actor_name",
    "actor_uid",
    "actor_template_atespace",
    "actor_template_name",
)
#: Where the activation's start is kept beside them (``epoch_unix_nano`` of the samples).
EPOCH_KEY: Final = "epoch_unix_nano"
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
#: How long Terminate waits for an effect another door started to finish before deleting.
SETTLE_TIMEOUT: Final = 600.0


class Door(Protocol):
    """Where events are submitted: the agent's ``AgentService`` (the JSON door's too)."""

    @property
    def agent(self) -> Agent:
        """The agent."""
        ...

    async def accept(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        """Submit ``event``: its transition, or why it was not accepted."""
        ...

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        """Count and log a refusal."""
        ...


class CallError(exceptions.SubstrateGpuError):
    """A call answered with a gRPC status other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _UidLocks:
    """One lock per actor UID for the lifecycle calls (upstream's per-actor lock): a Run and
    a Terminate of one UID never interleave. Entries go when nobody holds or waits."""

    locks: dict[str, tuple[anyio.Lock, int]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def held(self, uid: str) -> AsyncIterator[None]:
        lock, users = self.locks.get(uid, (anyio.Lock(), 0))
        self.locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self.locks[uid]
            if users == 1:
                del self.locks[uid]
            else:
                self.locks[uid] = (lock, users - 1)


class WorkerService:
    """The ``ateworker.Worker`` methods, on the agent's ``AgentService``."""

    def __init__(
        self,
        service: Door,
        *,
        runsc: str,
        dev_root: Path = Path("/"),
        cgroup_root: Path = cgroup_stats.CGROUP_ROOT,
        max_actors: int = _defaults.MAX_ACTORS,
        runsc_static_dir: Path = _defaults.RUNSC_STATIC_DIR,
    ) -> None:
        """``dev_root``: where a GPU worker's device nodes are (each actor gets all GPUs);
        ``cgroup_root``: where the sandboxes' cgroups are read; ``max_actors``: the UIDs
        hosted at once (``--max-actors``); ``runsc_static_dir``: where atelet stages the
        runsc a request's ``runsc_path`` names (``--runsc-static-dir``)."""
        self._service = service
        self._agent = service.agent
        self._runsc = runsc
        self._static_dir = runsc_static_dir
        self._gpu_worker = devices.has_gpu(dev_root)
        self._cgroup_root = cgroup_root
        self._cgroups: dict[str, str | None] = {}
        self._locks = _UidLocks()
        self._max_actors = max_actors
        self._admitting: set[str] = set()
        self.draining = False
        """Set on SIGTERM: lifecycle calls are answered UNAVAILABLE from then on."""

    # --- the calls ---------------------------------------------------------------------------

    async def RunWorkload(self, request: pb.RunWorkloadRequest) -> pb.RunWorkloadResponse:
        """Register a new activation of the sandbox and run it; OK once it is running."""
        uid = self._begin(request.actor_uid)
        workload = await self._workload(request.actor_dirs.oci_bundle_dir, request.spec)
        workload = self._staged(workload, request.runsc_path)
        async with self._locks.held(uid):
            actor_id = await self._activate(uid, request, workload)
            await self._reach(actor_id, events.RunRequested(actor_id=actor_id), "running", "run")
        return pb.RunWorkloadResponse()

    async def RestoreWorkload(
        self, request: pb.RestoreWorkloadRequest
    ) -> pb.RestoreWorkloadResponse:
        """Register a new activation and restore it from ``actor_dirs.restore_dir``."""
        uid = self._begin(request.actor_uid)
        self._full_scope(request.scope, "RestoreWorkload")
        workload = await self._workload(request.actor_dirs.oci_bundle_dir, request.spec)
        image = worker_requests.check_dir(request.actor_dirs.restore_dir, "actor_dirs.restore_dir")
        if not (image / "checkpoint.img").is_file():
            raise worker_requests.BadRequest(
                f"actor_dirs.restore_dir {str(image)!r} holds no checkpoint.img"
            )
        workload = self._staged(workload, request.runsc_path)
        async with self._locks.held(uid):
            actor_id = await self._activate(uid, request, workload)
            # runsc restore only reads the image: restore_dir is left as it is whether or
            # not preserve_restore_dir is set (tests/runsc/test_real_worker_api.py checks it).
            restore = events.RestoreRequested(actor_id=actor_id, image_path=str(image))
            await self._reach(actor_id, restore, "running", "restore")
        return pb.RestoreWorkloadResponse()

    async def CheckpointWorkload(
        self, request: pb.CheckpointWorkloadRequest
    ) -> pb.CheckpointWorkloadResponse:
        """Checkpoint the running sandbox into ``actor_dirs.checkpoint_dir``, then tear it
        down; the files written there."""
        uid = self._begin(request.actor_uid)
        self._full_scope(request.scope, "CheckpointWorkload")
        directory = request.actor_dirs.checkpoint_dir
        if not directory or not Path(directory).is_absolute():
            raise worker_requests.BadRequest(
                f"actor_dirs.checkpoint_dir {directory!r} is not an absolute path"
            )
        # Checked as Run's; the checkpoint runs the binary the activation runs under.
        worker_requests.check_runsc_path(request.runsc_path, self._static_dir)
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
            suspend = events.SuspendRequested(actor_id=view.actor_id, image_path=directory)
            await self._reach(view.actor_id, suspend, "suspended", "checkpoint", cleanup=False)
            try:
                # The workload is torn down after its checkpoint, as upstream's worker does.
                await self._delete(view.actor_id)
            except CallError as e:
                log.warning("delete after checkpoint failed", actor=view.actor_id, error=str(e))
        files = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
        return pb.CheckpointWorkloadResponse(snapshot_files=files)

    async def TerminateWorkload(
        self, request: pb.TerminateWorkloadRequest
    ) -> pb.TerminateWorkloadResponse:
        """Delete every live activation of the UID; OK when there is none (idempotent)."""
        uid = self._begin(request.actor_uid)
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
        return pb.GetWorkloadStatsResponse(sample=await self._sample(view))

    async def GetActiveWorkloadStats(
        self, request: pb.GetActiveWorkloadStatsRequest
    ) -> pb.GetActiveWorkloadStatsResponse:
        """A sample per live activation (empty: this worker executes nothing)."""
        views = [v for v in self._agent.actors() if self._uid_of(v) and v.state != "deleted"]
        return pb.GetActiveWorkloadStatsResponse(samples=[await self._sample(v) for v in views])

    # --- the machine ------------------------------------------------------------------------

    def _begin(self, uid: str) -> str:
        self._not_draining()
        return worker_requests.check_uid(uid)

    def _not_draining(self) -> None:
        if self.draining:
            raise CallError(
                grpc.StatusCode.UNAVAILABLE,
                "worker draining (SIGTERM): not accepting lifecycle calls; retry on another worker",
            )

    @staticmethod
    def _full_scope(scope: int, call: str) -> None:
        if scope == pb.SNAPSHOT_SCOPE_DATA:
            raise CallError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{call}: scope SNAPSHOT_SCOPE_DATA is not implemented by substrate-gpu (it "
                "needs runsc fscheckpoint, not proven here); use SNAPSHOT_SCOPE_FULL",
            )
        if scope != pb.SNAPSHOT_SCOPE_FULL:
            raise worker_requests.BadRequest(
                f"scope {scope} is not a snapshot scope: give SNAPSHOT_SCOPE_FULL"
            )

    def _staged(
        self, workload: worker_requests.Workload, runsc_path: str
    ) -> worker_requests.Workload:
        """``workload`` under the staged runsc ``runsc_path`` names (checked: issue 31 §5)."""
        staged = worker_requests.check_runsc_path(runsc_path, self._static_dir)
        return dataclasses.replace(workload, runsc=staged) if staged else workload

    async def _workload(self, bundle_dir: str, spec: pb.WorkloadSpec) -> worker_requests.Workload:
        names = [c.name for c in spec.containers]
        return await _blocking.run_abandonable(
            functools.partial(worker_requests.read_workload, bundle_dir, names),
            name="substrate-gpu read bundles",
        )

    @staticmethod
    def _uid_of(view: actors.ActorView) -> str:
        return view.identity.get("actor_uid", "")

    def _live(self, uid: str) -> actors.ActorView | None:
        """The UID's activation that is not deleted (the newest), or None."""
        live = [v for v in self._activations(uid) if v.state != "deleted"]
        return live[-1] if live else None

    def _activations(self, uid: str) -> list[actors.ActorView]:
        found = [v for v in self._agent.actors() if self._uid_of(v) == uid]
        return sorted(found, key=_activation_number)

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
        uid: str,
        request: pb.RunWorkloadRequest | pb.RestoreWorkloadRequest,
        workload: worker_requests.Workload,
    ) -> str:
        """Under the UID's lock: a new activation registered and sized (Run and Restore)."""
        self._not_draining()  # SIGTERM may have come while this call waited for the lock
        self._not_executing(uid)
        self._admit(uid)
        try:
            actor_id = await self._register(request, workload)
        finally:
            self._admitting.discard(uid)
        self._cgroups[actor_id] = await _blocking.run_abandonable(
            functools.partial(
                worker_requests.apply_size,
                workload.bundle_dir,
                actor_id,
                request.cpu_milli,
                request.memory_bytes,
            ),
            name="substrate-gpu size bundle",
        )
        return actor_id

    def _admit(self, uid: str) -> None:
        """Reserve the UID's slot, or refuse as upstream's worker does when it is full.

        A slot is held from here until the activation is deleted; UIDs being admitted count
        too, so concurrent Runs of different UIDs cannot overfill the worker."""
        hosted = {self._uid_of(v) for v in self._agent.actors() if v.state != "deleted"}
        hosted.discard("")
        if len(hosted | self._admitting) >= self._max_actors:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"worker is full: {self._max_actors} actors"
            )
        self._admitting.add(uid)

    async def _register(
        self,
        request: pb.RunWorkloadRequest | pb.RestoreWorkloadRequest,
        workload: worker_requests.Workload,
    ) -> str:
        """A new activation of the request's UID, registered and its bundle prepared."""
        uid = request.actor_uid
        n = len(self._activations(uid)) + 1
        while self._agent.actor(f"{uid}.{n}") is not None:
            n += 1
        actor_id = f"{uid}.{n}"
        identity = {name: getattr(request, name) for name in IDENTITY_FIELDS}
        identity[EPOCH_KEY] = str(time.time_ns())
        gpu = bool(workload.gpu_names) or self._gpu_worker
        bundle = str(workload.bundle_dir)
        await self._submit(
            events.ActorRegistered(
                actor_id=actor_id,
                gpu=gpu,
                bundle=bundle,
                gpu_names=workload.gpu_names,
                containers=workload.containers,
                container_gpus=dict(workload.container_gpus),
                runsc=workload.runsc,
                identity=identity,
            )
        )
        await self._submit(events.BundlePrepared(actor_id=actor_id, bundle=bundle))
        return actor_id

    async def _submit(self, event: events.Event) -> hooks.Transition:
        accepted = await self._service.accept(event)
        if isinstance(accepted, protocol.RequestError):
            self._service.reject(accepted, 0)
            code = (
                grpc.StatusCode.UNAVAILABLE
                if accepted.kind == "unavailable"
                else grpc.StatusCode.INVALID_ARGUMENT
                if accepted.kind in {"schema", "malformed"}
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            raise CallError(code, accepted.message)
        return accepted

    async def _reach(
        self, actor_id: str, event: events.Event, goal: str, what: str, *, cleanup: bool = True
    ) -> None:
        """Submit ``event`` and wait until the actor rests; an error unless it rests in
        ``goal``. ``cleanup``: a failed activation is deleted before answering."""
        rested = await self._until_rest(actor_id, event)
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

    async def _until_rest(self, actor_id: str, event: events.Event) -> hooks.Transition:
        """Submit ``event``; the transition that left the actor in a state with no effect."""
        in_flight = self._agent.spec.effects
        async with self._agent.subscribe(buffer=100_000) as transitions:
            submitted = await self._submit(event)
            if submitted.dest not in in_flight:
                return submitted
            try:
                async for t in transitions:
                    if t.actor_id == actor_id and t.dest not in in_flight:
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
        """Delete the actor (waiting out an effect in flight first); an error if it fails."""
        view = self._agent.actor(actor_id)
        if view is None or view.state == "deleted":
            return
        if view.state in self._agent.spec.effects and view.state != "deleting":
            with anyio.move_on_after(SETTLE_TIMEOUT):
                async with self._agent.subscribe(buffer=100_000) as transitions:
                    async for t in transitions:
                        if t.actor_id == actor_id and t.dest not in self._agent.spec.effects:
                            break
        view = self._agent.actor(actor_id)
        if view is None or view.state == "deleted":
            return
        if view.state == "deleting":
            await self._agent.wait_for_state(actor_id, "deleted", timeout=SETTLE_TIMEOUT)
            return
        await self._reach(
            actor_id, events.DeleteRequested(actor_id=actor_id), "deleted", "delete", cleanup=False
        )

    # --- stats --------------------------------------------------------------------------------

    async def _sample(self, view: actors.ActorView) -> pb.WorkloadStatsSample:
        identity = view.identity
        sample = pb.WorkloadStatsSample(
            sandbox_class=pb.SANDBOX_CLASS_GVISOR,
            observed_at_unix_nano=time.time_ns(),
            epoch_unix_nano=int(identity.get(EPOCH_KEY, "0") or 0),
            atespace=identity.get("atespace", ""),
            actor_name=identity.get("actor_name", ""),
            actor_uid=identity.get("actor_uid", ""),
            actor_template_atespace=identity.get("actor_template_atespace", ""),
            actor_template_name=identity.get("actor_template_name", ""),
        )
        cgroup = await self._cgroup_of(view)
        reading = (
            cgroup_stats.read(cgroup, self._cgroup_root)
            if cgroup is not None and view.state not in {"registered", "bundle_prepared"}
            else None
        )
        if reading is not None:
            sample.source = pb.STATS_SOURCE_CGROUP
            sample.memory_current_bytes = reading.memory_current_bytes
            sample.memory_peak_bytes = reading.memory_peak_bytes
            sample.memory_working_set_bytes = reading.memory_working_set_bytes
            sample.cpu_usage_usec = reading.cpu_usage_usec
        return sample

    async def _cgroup_of(self, view: actors.ActorView) -> str | None:
        """The sandbox's cgroup: set at Run/Restore, else read back from ``_pause``'s bundle
        (an agent restarted on its log; in a thread); None when not an absolute cgroupfs
        path."""
        if view.actor_id not in self._cgroups:
            path = None
            with contextlib.suppress(worker_requests.BadRequest):
                config = await _blocking.run_abandonable(
                    functools.partial(worker_requests.read_pause_config, Path(view.bundle)),
                    name="substrate-gpu read bundle",
                )
                linux = config.get("linux")
                if isinstance(linux, dict) and isinstance(linux.get("cgroupsPath"), str):
                    path = linux["cgroupsPath"]
            self._cgroups[view.actor_id] = path
        path = self._cgroups[view.actor_id]
        return path if path is not None and path.startswith("/") else None

    # --- serving -------------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method of :data:`SERVICE`, from the descriptor (a method without its
        implementation here fails at once, not at its first call)."""
        table = {}
        for method in SERVICE.methods:
            request_class = getattr(pb, method.input_type.name)
            table[method.name] = grpc.unary_unary_rpc_method_handler(
                self._answering(method.name, getattr(self, method.name)),
                request_deserializer=request_class.FromString,
                response_serializer=_serialize,
            )
        return grpc.method_handlers_generic_handler(SERVICE.full_name, table)

    def _answering(
        self, name: str, call: Callable[[Any], Awaitable[message.Message]]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[message.Message]]:
        """``call`` with its errors turned into statuses; the agent stays up whatever comes."""

        @functools.wraps(call)
        async def answer(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> message.Message:
            try:
                return await call(request)
            except CallError as e:
                log.info("worker call answered", call=name, code=e.code.name, error=e.message)
                await context.abort(e.code, e.message)
            except worker_requests.BadRequest as e:
                log.info("worker call refused", call=name, code="INVALID_ARGUMENT", error=str(e))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            except Exception as e:  # the call's boundary: see the module doc
                log.exception("worker call failed unexpectedly", call=name)
                await context.abort(
                    grpc.StatusCode.INTERNAL, f"{name}: unexpected {type(e).__name__}: {e}"
                )
            raise AssertionError("unreachable: abort raises")  # pragma: no cover

        return answer


def _activation_number(view: actors.ActorView) -> int:
    """``n`` of an actor ``<uid>.<n>`` (0 for one the JSON door registered otherwise)."""
    suffix = view.actor_id.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else 0


def _serialize(response: message.Message) -> bytes:
    return response.SerializeToString()


@contextlib.asynccontextmanager
async def serving(
    worker: WorkerService, path: Path, claim: Callable[[Path], None]
) -> AsyncIterator[None]:
    """Serve ``worker`` on the Unix socket ``path`` (mode 0600) while inside.

    ``claim`` replaces a stale socket file and refuses one another process serves (the
    JSON socket's rule). On leaving, calls in progress get a moment to answer.
    """
    _socketfile.make_private_dir(path, "worker socket", "choose another --worker-socket")
    claim(path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((worker.handler(),))
    try:
        with _socketfile.private_umask():
            server.add_insecure_port(f"unix:{path}")
            await server.start()
    except RuntimeError as e:
        raise exceptions.ConfigError(
            f"while serving the worker API on {path}: {e}; choose another --worker-socket"
        ) from e
    ours = path.stat()
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop(grace=1.0)
        _socketfile.unlink_if_ours(path, ours)
