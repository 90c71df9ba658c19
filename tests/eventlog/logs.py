"""Building event logs for tests: live agent runs on the doubles, and hand-made lines."""

from __future__ import annotations

from pathlib import Path

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime
from lifecycle.factories import bring_to_running

from substrate_gpu.eventlog import EventLog
from substrate_gpu.lifecycle import Agent, actors, events, hooks


class Collector:
    """A TransitionObserver keeping every transition."""

    def __init__(self) -> None:
        self.transitions: list[hooks.Transition] = []

    def on_transition(self, t: hooks.Transition) -> None:
        self.transitions.append(t)


async def short_life(
    path: Path, tmp: Path, *, rotate_bytes: int | None = None
) -> dict[str, actors.ActorView]:
    """Three actors (GPU, GPU whose suspend is refused, CPU) through a short life; live states."""
    runtime = FakeRuntime()
    async with await EventLog.open(path, rotate_bytes=rotate_bytes) as log:
        async with Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=FakeInjector(),
            checkpoint_root=tmp / "checkpoints",
            recorder=log,
        ) as agent:
            await bring_to_running(agent, "g1")
            await bring_to_running(agent, "c1", gpu=False)
            # g2's pool refuses GPU suspends while a context is live: refused by the machine.
            await agent.submit(
                events.ActorRegistered(
                    actor_id="g2", gpu=True, bundle="/b/g2", suspend_policy="refuse"
                )
            )
            await agent.submit(events.BundlePrepared(actor_id="g2", bundle="/b/g2"))
            await agent.submit(events.RunRequested(actor_id="g2"))
            await agent.wait_for_state("g2", "running", timeout=5)
            runtime.open_context("g2")
            await agent.submit(events.CudaContextOpened(actor_id="g2", pid=7))
            await agent.submit(events.SuspendRequested(actor_id="g2"))
            await agent.submit(events.SuspendRequested(actor_id="g1"))
            await agent.wait_for_state("g1", "suspended", timeout=5)
            await agent.submit(events.DeleteRequested(actor_id="c1"))
            await agent.settle()
            views = {a: agent.actor(a) for a in ("g1", "g2", "c1")}
            return {a: v for a, v in views.items() if v is not None}


def header(base_seq: int = 0, snapshot: str | None = None) -> str:
    """A header line (no newline)."""
    from substrate_gpu.eventlog import format

    return format.Header(format.VERSION, base_seq, snapshot).to_json()


def registered(actor_id: str, seq: int, *, gpu: bool = True) -> str:
    """An accepted actor_registered line (no newline)."""
    return events.ActorRegistered(
        actor_id=actor_id, gpu=gpu, bundle=f"/b/{actor_id}", seq=seq, at=1.0
    ).to_json()


def write_lines(path: Path, *lines: str, tail: str = "") -> Path:
    """A log made of ``lines`` (each newline-terminated) and an unterminated ``tail``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines) + tail)
    return path
