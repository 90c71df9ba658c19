"""An agent process over real runsc with a GPU allocator, for SIGKILL tests (issue 30).

``python gpu_agent.py ROOT RUNSC STEPS``: recovers ``ROOT/events.jsonl`` when it holds
events, then serves an :class:`~substrate_gpu.lifecycle.Agent` whose runtime is the real
runsc driver (``--root ROOT/runsc-root``) and whose allocator has four GPUs, and carries out
``STEPS`` (JSON: event objects to submit, ``["wait", actor, state]`` to wait for), printing
``ok <n>`` after each, then ``done``, then waits to be killed.

There is no NVIDIA driver here, so nvproxy cannot start: the GPU actors' runsc commands go
without ``--nvproxy`` (:class:`WithoutNvproxy`) and the injector only records the names it
was given. Everything else is production: the allocator, the pipeline, recovery, the runsc
driver and the order of every runsc command of a sandbox.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle.doubles import FakeInjector
from support import real_runsc

from substrate_gpu import eventlog
from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.lifecycle.allocation import GpuAllocator, WorkerGpus
from substrate_gpu.observability import configure_logging
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.runsc import driver

GPUS = WorkerGpus.named([f"nvidia.com/gpu={i}" for i in range(4)])


class NoContexts:
    """No CUDA client is ever live (there is no GPU): a suspend goes to a plain checkpoint."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        return ()


class WithoutNvproxy(driver.RunscDriver):
    """The real runsc driver, every command as it builds it, less ``--nvproxy``."""

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        await super().create(container_id, bundle, nvproxy=False)

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        await super().restore(container_id, bundle, image_path, nvproxy=False)

    def for_actor(self, actor_id: str) -> WithoutNvproxy:
        own = super().for_actor(actor_id)
        return WithoutNvproxy(own.config, parent=self)


def runtime(root: Path, runsc: str) -> WithoutNvproxy:
    return WithoutNvproxy(
        driver.RunscConfig(
            root=root / "runsc-root", runsc=runsc, global_flags=real_runsc.GLOBAL_FLAGS
        )
    )


async def main(root: Path, runsc: str, steps: list[object]) -> None:
    sandboxes = runtime(root, runsc)
    log = root / "events.jsonl"
    resume = None
    if log.exists() and log.stat().st_size:
        recovered = await eventlog.recover(
            log, runtime=sandboxes, checkpoint_root=root / "checkpoints"
        )
        resume = recovered.resume
        print(json.dumps({"reaped": list(recovered.reaped)}), flush=True)
    async with (
        await eventlog.EventLog.open(log) as recorder,
        Agent(
            runtime=sandboxes,
            probe=NoContexts(),
            injector=FakeInjector(),
            checkpoint_root=root / "checkpoints",
            recorder=recorder,
            resume=resume,
            allocator=GpuAllocator(GPUS, name="w"),
        ) as agent,
    ):
        for n, step in enumerate(steps):
            if isinstance(step, list):
                _, actor_id, state = step
                await agent.wait_for_state(actor_id, state, timeout=120)
            else:
                assert isinstance(step, dict)
                await agent.submit(events.from_dict(step))
            print(f"ok {n}", flush=True)
        print("done", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    configure_logging(stream=sys.stderr)
    anyio.run(main, Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
