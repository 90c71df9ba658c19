"""Regenerate the scenario logs: ``.venv/bin/python tests/scenarios/generate.py``.

Each scenario runs a real :class:`Agent` on the lifecycle's in-process doubles with an
:class:`EventLog`, then writes beside this file:

- ``<name>.jsonl``: the event log, with times replaced by a synthetic clock (one second per
  line from 2026-01-01) and temporary paths by ``/var/lib/substrate/...``, so the files
  read well and diff cleanly (replay never uses either);
- ``<name>.expected.json``: what the *live agent* did (not what replay says): each actor's
  final view, every transition in order, every refusal, and the scenario's key transitions
  (hand-written below and checked against the live run here).

The scenario tests replay the logs and compare with the expected files.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime

from substrate_gpu.eventlog import EventLog, recover, replay
from substrate_gpu.lifecycle import Agent, errors, events, hooks
from substrate_gpu.lifecycle.actors import ActorView

HERE = Path(__file__).resolve().parent
EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z
CHECKPOINTS = "/var/lib/substrate/checkpoints"


class SandboxKillingRuntime(FakeRuntime):
    """runsc as it behaves without --leave-running: a failed checkpoint kills the sandbox."""

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        if "checkpoint" in self.fail and not leave_running and container_id in self.containers:
            self._stop(container_id)
        await super().checkpoint(container_id, image_path, leave_running=leave_running)


@dataclasses.dataclass
class World:
    """A scenario's doubles, log and agent factory."""

    tmp: Path
    runtime: FakeRuntime = dataclasses.field(default_factory=FakeRuntime)
    injector: FakeInjector = dataclasses.field(default_factory=FakeInjector)
    transitions: list[hooks.Transition] = dataclasses.field(default_factory=list)
    refusals: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    views: dict[str, ActorView] = dataclasses.field(default_factory=dict)
    """Each actor's last view seen on the live agent."""

    @property
    def log(self) -> Path:
        return self.tmp / "events.jsonl"

    def agent(self, log: EventLog, **kw: object) -> Agent:
        collector = self

        class Observer:
            def on_transition(self, t: hooks.Transition) -> None:
                collector.transitions.append(t)

        return Agent(
            runtime=self.runtime,
            probe=FakeProbe(self.runtime),
            injector=self.injector,
            checkpoint_root=self.tmp / "checkpoints",
            recorder=log,
            observers=[Observer()],
            **kw,  # type: ignore[arg-type]
        )

    async def submit(self, agent: Agent, event: events.Event) -> None:
        """Submit; a refusal is noted (and logged by the agent), not raised."""
        try:
            await agent.submit(event)
        except errors.InvalidEvent as e:
            self.refusals.append((e.actor_id, e.event_type, e.state))
        await agent.settle()
        for actor_id in {t.actor_id for t in self.transitions}:
            view = agent.actor(actor_id)
            if view is not None:
                self.views[actor_id] = view


async def _register_and_run(w: World, agent: Agent, actor: str, *, gpu: bool = True) -> None:
    await w.submit(
        agent, events.ActorRegistered(actor_id=actor, gpu=gpu, bundle=f"/run/bundles/{actor}")
    )
    await w.submit(agent, events.BundlePrepared(actor_id=actor, bundle=f"/run/bundles/{actor}"))
    await w.submit(agent, events.RunRequested(actor_id=actor))


async def happy_gpu_actor(w: World) -> None:
    """A GPU actor's whole life: run (inject, create, start), suspend, restore, delete."""
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await _register_and_run(w, agent, "gpu-1")
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))
        await w.submit(agent, events.BundlePrepared(actor_id="gpu-1", bundle="/run/bundles/gpu-1"))
        await w.submit(agent, events.RestoreRequested(actor_id="gpu-1"))
        await w.submit(agent, events.DeleteRequested(actor_id="gpu-1"))


async def suspend_refused_then_accepted(w: World) -> None:
    """gpu-1 (policy auto, no CUDA suspend route on this node): the probe finds the live
    context and the checkpoint is refused before any attempt; once the context closes the
    same request checkpoints the actor. gpu-2 (policy refuse): an observed live context
    refuses the suspend in the machine itself, a reflexive transition."""
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await _register_and_run(w, agent, "gpu-1")
        w.runtime.open_context("gpu-1")
        await w.submit(agent, events.CudaContextOpened(actor_id="gpu-1", pid=42))
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))
        w.runtime.close_context("gpu-1")
        await w.submit(agent, events.CudaContextClosed(actor_id="gpu-1", pid=42))
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))
        await w.submit(
            agent,
            events.ActorRegistered(
                actor_id="gpu-2", gpu=True, bundle="/run/bundles/gpu-2", suspend_policy="refuse"
            ),
        )
        await w.submit(agent, events.BundlePrepared(actor_id="gpu-2", bundle="/run/bundles/gpu-2"))
        await w.submit(agent, events.RunRequested(actor_id="gpu-2"))
        w.runtime.open_context("gpu-2")
        await w.submit(agent, events.CudaContextOpened(actor_id="gpu-2", pid=43))
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-2"))


async def checkpoint_failed_by_runtime(w: World) -> None:
    """runsc fails a checkpoint without --leave-running: the sandbox is gone, the actor is
    stopped (never lost) and restored from its last good checkpoint."""
    w.runtime = SandboxKillingRuntime(leave_running=False)
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await _register_and_run(w, agent, "gpu-1")
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))
        await w.submit(agent, events.RestoreRequested(actor_id="gpu-1"))
        w.runtime.fail["checkpoint"] = "checkpoint failed: writing pages: no space left on device"
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))
        w.runtime.fail.clear()
        await w.submit(agent, events.RestoreRequested(actor_id="gpu-1"))


async def restore_on_another_worker(w: World) -> None:
    """An actor checkpointed on worker-7 is restored here from the image the event names."""
    image = w.tmp / "checkpoints" / "elsewhere" / "gpu-1" / "12"
    image.mkdir(parents=True)
    (image / "checkpoint.img").write_text("image")
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await w.submit(
            agent, events.ActorRegistered(actor_id="gpu-1", gpu=True, bundle="/run/bundles/gpu-1")
        )
        await w.submit(agent, events.BundlePrepared(actor_id="gpu-1", bundle="/run/bundles/gpu-1"))
        await w.submit(
            agent,
            events.RestoreRequested(actor_id="gpu-1", image_path=str(image), worker="worker-7"),
        )


async def crash_mid_effect_then_recovery(w: World) -> None:
    """The agent dies while gpu-1 checkpoints and gpu-2 is being created; runsc finished
    both meanwhile. Recovery asks runsc: gpu-1's sandbox is gone and its image whole
    (checkpoint_written), gpu-2's container is created (sandbox_created, then start runs)."""
    w.runtime.leave_running = False
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await _register_and_run(w, agent, "gpu-1")
        w.runtime.hang.update({"checkpoint", "create"})
        await agent.submit(events.SuspendRequested(actor_id="gpu-1"))
        await agent.submit(
            events.ActorRegistered(actor_id="gpu-2", gpu=True, bundle="/run/bundles/gpu-2")
        )
        await agent.submit(events.BundlePrepared(actor_id="gpu-2", bundle="/run/bundles/gpu-2"))
        await agent.submit(events.RunRequested(actor_id="gpu-2"))
        await agent.wait_for_state("gpu-2", "creating", timeout=5)
        await anyio.sleep(0.01)
    # "Crash": the agent is gone; runsc completed both operations on its own.
    w.runtime.hang.clear()
    seq = replay(w.log).causes["gpu-1"].seq  # the event that entered checkpointing
    await w.runtime.checkpoint(
        "gpu-1", w.tmp / "checkpoints" / "gpu-1" / str(seq), leave_running=False
    )
    await w.runtime.create("gpu-2", Path("/run/bundles/gpu-2"), nvproxy=True)
    recovery = await recover(w.log, runtime=w.runtime, checkpoint_root=w.tmp / "checkpoints")
    async with await EventLog.open(w.log) as log, w.agent(log, resume=recovery.resume) as agent:
        await agent.settle()
        await w.submit(agent, events.BundlePrepared(actor_id="gpu-1", bundle="/run/bundles/gpu-1"))
        await w.submit(agent, events.RestoreRequested(actor_id="gpu-1"))


async def cpu_actor_skips_injection(w: World) -> None:
    """A CPU actor goes from bundle_prepared straight to creating: no injection, no nvproxy."""
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await _register_and_run(w, agent, "cpu-1", gpu=False)
        await w.submit(agent, events.SuspendRequested(actor_id="cpu-1"))


async def event_out_of_order_rejected(w: World) -> None:
    """Events out of order are refused, logged as rejections, and change nothing; the same
    events in order are then accepted."""
    async with await EventLog.open(w.log) as log, w.agent(log) as agent:
        await w.submit(agent, events.RunRequested(actor_id="gpu-1"))  # unknown actor
        await w.submit(
            agent, events.ActorRegistered(actor_id="gpu-1", gpu=True, bundle="/run/bundles/gpu-1")
        )
        await w.submit(agent, events.RunRequested(actor_id="gpu-1"))  # bundle not prepared
        await w.submit(agent, events.SuspendRequested(actor_id="gpu-1"))  # not running
        await w.submit(agent, events.BundlePrepared(actor_id="gpu-1", bundle="/run/bundles/gpu-1"))
        await w.submit(agent, events.RunRequested(actor_id="gpu-1"))
        await w.submit(agent, events.CudaContextClosed(actor_id="gpu-1"))  # no context open


#: name -> (run, key transitions that must appear in this order: actor, from, to, trigger)
SCENARIOS: dict[str, tuple[Callable[[World], Awaitable[None]], list[list[str]]]] = {
    "happy_gpu_actor": (
        happy_gpu_actor,
        [
            ["gpu-1", "bundle_prepared", "allocating", "run_requested"],
            ["gpu-1", "allocating", "injecting", "gpus_allocated"],
            ["gpu-1", "injecting", "creating", "gpu_injected"],
            ["gpu-1", "starting", "running", "sandbox_started"],
            ["gpu-1", "running", "probing", "suspend_requested"],
            ["gpu-1", "probing", "checkpointing", "no_live_context"],
            ["gpu-1", "checkpointing", "suspended", "checkpoint_written"],
            ["gpu-1", "restoring", "running", "restored"],
            ["gpu-1", "deleting", "deleted", "deleted"],
        ],
    ),
    "suspend_refused_then_accepted": (
        suspend_refused_then_accepted,
        [
            ["gpu-1", "running", "running", "cuda_context_opened"],
            ["gpu-1", "running", "probing", "suspend_requested"],
            ["gpu-1", "probing", "running", "checkpoint_refused"],
            ["gpu-1", "running", "running", "cuda_context_closed"],
            ["gpu-1", "running", "probing", "suspend_requested"],
            ["gpu-1", "probing", "checkpointing", "no_live_context"],
            ["gpu-1", "checkpointing", "suspended", "checkpoint_written"],
            ["gpu-2", "running", "running", "suspend_requested"],
        ],
    ),
    "checkpoint_failed_by_runtime": (
        checkpoint_failed_by_runtime,
        [
            ["gpu-1", "checkpointing", "suspended", "checkpoint_written"],
            ["gpu-1", "restoring", "running", "restored"],
            ["gpu-1", "checkpointing", "stopped", "checkpoint_failed"],
            ["gpu-1", "stopped", "allocating", "restore_requested"],
            ["gpu-1", "allocating", "restoring", "gpus_allocated"],
            ["gpu-1", "restoring", "running", "restored"],
        ],
    ),
    "restore_on_another_worker": (
        restore_on_another_worker,
        [
            ["gpu-1", "bundle_prepared", "allocating", "restore_requested"],
            ["gpu-1", "allocating", "restoring", "gpus_allocated"],
            ["gpu-1", "restoring", "running", "restored"],
        ],
    ),
    "crash_mid_effect_then_recovery": (
        crash_mid_effect_then_recovery,
        [
            ["gpu-1", "probing", "checkpointing", "no_live_context"],
            ["gpu-2", "injecting", "creating", "gpu_injected"],
            ["gpu-1", "checkpointing", "suspended", "checkpoint_written"],
            ["gpu-2", "creating", "starting", "sandbox_created"],
            ["gpu-2", "starting", "running", "sandbox_started"],
            ["gpu-1", "restoring", "running", "restored"],
        ],
    ),
    "cpu_actor_skips_injection": (
        cpu_actor_skips_injection,
        [
            ["cpu-1", "bundle_prepared", "creating", "run_requested"],
            ["cpu-1", "starting", "running", "sandbox_started"],
            ["cpu-1", "checkpointing", "suspended", "checkpoint_written"],
        ],
    ),
    "event_out_of_order_rejected": (
        event_out_of_order_rejected,
        [
            ["gpu-1", "new", "registered", "actor_registered"],
            ["gpu-1", "registered", "bundle_prepared", "bundle_prepared"],
            ["gpu-1", "starting", "running", "sandbox_started"],
        ],
    ),
}


def _is_subsequence(keys: list[list[str]], seen: list[list[str]]) -> bool:
    it = iter(seen)
    return all(key in it for key in keys)


def _normalise(log: Path, tmp: Path) -> str:
    """Synthetic times and stable paths (see the module doc)."""
    out = []
    for i, line in enumerate(log.read_text().splitlines()):
        data = json.loads(line)
        for record in (data, data.get("event")):
            if isinstance(record, dict) and "at" in record:
                record["at"] = EPOCH + i
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        out.append(text.replace(str(tmp / "checkpoints"), CHECKPOINTS))
    return "".join(line + "\n" for line in out)


async def _generate(name: str) -> None:
    run, keys = SCENARIOS[name]
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        await run(world)
        text = _normalise(world.log, Path(tmp))
        seen = [[t.actor_id, t.source, t.dest, t.trigger] for t in world.transitions]
        assert _is_subsequence(keys, seen), (name, seen)
        views = {a: msgspec.structs.asdict(world.views[a]) for a in sorted(world.views)}
    expected = {
        "description": (run.__doc__ or "").strip(),
        "final": {
            a: {
                k: (
                    v.replace(str(Path(tmp) / "checkpoints"), CHECKPOINTS)
                    if isinstance(v, str)
                    else v
                )
                for k, v in view.items()
            }
            for a, view in views.items()
        },
        "transitions": seen,
        "refusals": [list(r) for r in world.refusals],
        "key_transitions": keys,
    }
    (HERE / f"{name}.jsonl").write_text(text)
    (HERE / f"{name}.expected.json").write_text(
        json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    )


async def main() -> None:
    for name in SCENARIOS:
        await _generate(name)
        print(f"wrote tests/scenarios/{name}.jsonl")


if __name__ == "__main__":
    anyio.run(main)
