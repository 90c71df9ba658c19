"""Embedding the lifecycle agent: one GPU actor run, refused a suspend, suspended, restored.

Runs anywhere (``python examples/embed_agent.py``): the runtime, probe and injector below are
in-memory stand-ins. In the node agent, pass the runsc driver, the fd-scanning CUDA probe
and the CDI injector instead; nothing else changes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

from substrate_gpu import Agent, events
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.runsc.api import ContainerState, RunscFeatures


class InMemoryRuntime:
    """Just enough of SandboxRuntime for the example."""

    def __init__(self) -> None:
        self.status: dict[str, str] = {}

    async def features(self) -> RunscFeatures:
        return RunscFeatures("runsc version example", True, False, False, False)

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        print(f"  runtime: create {container_id} nvproxy={nvproxy}")
        self.status[container_id] = "created"

    async def start(self, container_id: str) -> None:
        self.status[container_id] = "running"

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        print(f"  runtime: checkpoint {container_id} -> {image_path.name}")
        # As runsc does: the image directory may exist (the agent makes it, 0700, first).
        image_path.mkdir(parents=True, exist_ok=True)
        (image_path / "checkpoint.img").write_text(container_id)

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        print(f"  runtime: restore {container_id} nvproxy={nvproxy}")
        self.status[container_id] = "running"

    async def state(self, container_id: str) -> ContainerState:
        status = self.status[container_id]
        return ContainerState(container_id, status, 4242, "/bundle")  # type: ignore[arg-type]

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        self.status[container_id] = "stopped"

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        self.status.pop(container_id, None)


class NoLiveClients:
    """A CUDA probe that never finds a client (the real one scans /proc/<pid>/fd)."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        return ()


async def inject(bundle: Path) -> int:
    """The GPU injector: edits bundle/config.json, returns the device nodes injected."""
    return 2


async def main() -> None:
    with tempfile.TemporaryDirectory() as checkpoints:
        async with (
            Agent(
                runtime=InMemoryRuntime(),
                probe=NoLiveClients(),
                injector=inject,
                checkpoint_root=Path(checkpoints),
            ) as agent,
            agent.subscribe() as transitions,
        ):

            async def show() -> None:
                async for t in transitions:
                    why = f"  ({t.reason})" if t.reason else ""
                    print(f"{t.actor_id}: {t.source} -> {t.dest} on {t.trigger}{why}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(show)
                a = "actor-1"
                # The pool refuses to suspend a live CUDA context ("auto" would look for a
                # cuda-checkpoint route first: see docs/gpu-suspend.md).
                await agent.submit(
                    events.ActorRegistered(
                        actor_id=a, gpu=True, bundle="/b/1", suspend_policy="refuse"
                    )
                )
                await agent.submit(events.BundlePrepared(actor_id=a, bundle="/b/1"))
                await agent.submit(events.RunRequested(actor_id=a))
                await agent.wait_for_state(a, "running", timeout=10)
                # The node agent saw the actor open a CUDA context: suspend is refused.
                await agent.submit(events.CudaContextOpened(actor_id=a, pid=7))
                await agent.submit(events.SuspendRequested(actor_id=a))
                await agent.submit(events.CudaContextClosed(actor_id=a, pid=7))
                await agent.submit(events.SuspendRequested(actor_id=a))
                await agent.wait_for_state(a, "suspended", timeout=10)
                await agent.submit(events.RestoreRequested(actor_id=a))
                await agent.wait_for_state(a, "running", timeout=10)
                print("actors by state:", {s: n for s, n in agent.state_counts().items() if n})
                tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
