"""Durable-dir volumes in the worker API's calls, as upstream's ``durable.go`` does them:
checked from the spec (:func:`mounts_of`), extracted and bound before a sandbox boots
(:func:`prepare_volumes`), tarred into a checkpoint (:func:`archive`; a DATA snapshot
pauses the sandbox around it, :func:`snapshot_data`). The tar and bind mechanics are
:mod:`.durable_dirs`'; here their errors become the call's status.
"""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import grpc

from substrate_gpu import _blocking, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import sandbox
from substrate_gpu.runsc import api as runsc_api
from substrate_gpu.service import durable_dirs, worker_requests
from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.service.worker_calls import CallError

log = get_logger(__name__)


def mounts_of(spec: pb.WorkloadSpec) -> tuple[durable_dirs.DurableMount, ...]:
    """The spec's durable-dir volume mounts, checked (INVALID_ARGUMENT naming one)."""
    try:
        return durable_dirs.check_mounts(
            (c.name, [(m.volume_name, m.mount_path) for m in c.durable_dir_volume_mounts])
            for c in spec.containers
        )
    except durable_dirs.DurableDirError as e:
        raise worker_requests.BadRequest(str(e)) from e


async def prepare_volumes(
    workload: worker_requests.Workload,
    durable: tuple[durable_dirs.DurableMount, ...],
    volumes_dir: Path,
    restore_from: Path | None,
) -> None:
    """Before the sandbox boots: the volumes a Restore's snapshot holds extracted into
    their directories (upstream's ``untarDurableVolumes``), and each app container's
    config given the binds of its durable-dir volumes."""
    if not durable:
        return
    volumes = durable_dirs.volume_names(durable)
    try:
        if restore_from is not None:
            used = await _blocking.run_abandonable(
                functools.partial(durable_dirs.extract, restore_from, volumes_dir, volumes),
                name="substrate-gpu restore durable dirs",
            )
            log.info("durable-dir volumes restored", volumes=used)
        await _blocking.run_abandonable(
            functools.partial(durable_dirs.apply_mounts, workload.bundle_dir, durable, volumes_dir),
            name="substrate-gpu bind durable dirs",
        )
    except durable_dirs.DurableDirError as e:
        raise worker_requests.BadRequest(str(e)) from e


async def archive(volumes_dir: Path, directory: Path, volumes: tuple[str, ...]) -> list[str]:
    """Each volume's tar written into ``directory`` (upstream's ``tarDurableVolumes``);
    never cancelled half-way (the call's deadline does not stop it)."""
    archive = functools.partial(durable_dirs.archive, volumes_dir, directory, volumes)
    with anyio.CancelScope(shield=True):
        try:
            files = await _blocking.run_abandonable(
                archive, name="substrate-gpu archive durable dirs"
            )
        except (durable_dirs.DurableDirError, OSError) as e:
            raise CallError(grpc.StatusCode.INTERNAL, str(e)) from e
    return files


async def snapshot_data(
    runtime: object, actor_id: str, volumes_dir: Path, directory: Path, volumes: tuple[str, ...]
) -> list[str]:
    """SNAPSHOT_SCOPE_DATA: ``runsc pause _pause``, the volumes' tars, ``runsc resume
    _pause``. Shielded from the call's cancellation as a whole: a deadline that passes
    mid-tar never leaves the sandbox paused (upstream resumes on a context of its own)."""
    if isinstance(runtime, runsc_api.PerActorRoot):
        runtime = runtime.for_actor(actor_id)
    if not isinstance(runtime, runsc_api.SandboxPause):
        raise CallError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "scope SNAPSHOT_SCOPE_DATA needs a runtime that can pause a sandbox "
            "(runsc pause/resume); this agent's has none",
        )
    with anyio.CancelScope(shield=True):
        log.info("pausing the sandbox for its data snapshot", actor=actor_id)
        try:
            await runtime.pause(sandbox.PAUSE)
        except exceptions.SubstrateGpuError as e:
            raise CallError(
                grpc.StatusCode.INTERNAL, f"while pausing the sandbox of {actor_id!r}: {e}"
            ) from e
        archived: list[str] | CallError
        try:
            archived = await archive(volumes_dir, directory, volumes)
        except CallError as e:
            archived = e
        try:
            await runtime.resume(sandbox.PAUSE)
        except exceptions.SubstrateGpuError as e:
            raise CallError(
                grpc.StatusCode.INTERNAL,
                f"while resuming the sandbox of {actor_id!r} after its data snapshot: {e}",
            ) from e
    if isinstance(archived, CallError):
        raise archived
    return archived
