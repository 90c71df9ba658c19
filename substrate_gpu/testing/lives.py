"""The machine's paths to ``running``, as event lists: the one place tests and benchmarks
script them.

A state added on the way to ``running`` (as ``verifying`` was) changes these two lists and
nothing in the tests or benchmarks that replay whole lives through the machine
(docs/architecture.md, "Adding a state").
"""

from __future__ import annotations

from substrate_gpu.lifecycle import events


def to_running(actor_id: str, *, gpu: bool, devices: int = 1) -> list[events.Event]:
    """A new actor's events up to ``running``: registered, bundle prepared, run requested,
    then (a GPU actor) GPUs allocated and injected, the sandbox created and started, and
    (a GPU actor) its GPUs verified."""
    bundle = f"/b/{actor_id}"
    return [
        events.ActorRegistered(actor_id=actor_id, gpu=gpu, bundle=bundle),
        events.BundlePrepared(actor_id=actor_id, bundle=bundle),
        events.RunRequested(actor_id=actor_id),
        *(
            [
                events.GpusAllocated(actor_id=actor_id, names=()),
                events.GpuInjected(actor_id=actor_id, devices=devices),
            ]
            if gpu
            else []
        ),
        events.SandboxCreated(actor_id=actor_id),
        events.SandboxStarted(actor_id=actor_id),
        # A GPU sandbox runs once it sees only its GPUs.
        *([events.GpusVerified(actor_id=actor_id)] if gpu else []),
    ]


def restored_to_running(
    actor_id: str,
    *,
    gpu: bool,
    image_path: str,
    devices: int = 1,
    cuda_pids: str = "",
) -> list[events.Event]:
    """A ``suspended`` actor's events back to ``running``: restore requested, then (a GPU
    actor) GPUs allocated, restored (with ``cuda_pids``: on the exec route, whose CUDA
    processes are resumed) and its GPUs verified."""
    if not gpu:
        return [
            events.RestoreRequested(actor_id=actor_id),
            events.Restored(actor_id=actor_id, image_path=image_path),
        ]
    route = events.ROUTE_EXEC if cuda_pids else ""
    return [
        events.RestoreRequested(actor_id=actor_id),
        events.GpusAllocated(actor_id=actor_id, names=()),
        events.Restored(
            actor_id=actor_id, image_path=image_path, devices=devices, cuda_route=route
        ),
        *([events.CudaResumed(actor_id=actor_id, pids=cuda_pids)] if cuda_pids else []),
        events.GpusVerified(actor_id=actor_id),
    ]
