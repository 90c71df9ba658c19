"""Building any event type with plausible field values (tests generate events from the YAML)."""

from __future__ import annotations

import msgspec

from substrate_gpu.lifecycle import Agent, events

#: A valid value for every required event field, by field name.
DEFAULTS: dict[str, object] = {
    "gpu": True,
    "bundle": "/bundles/a",
    "devices": 2,
    "message": "boom",
    "image_path": "/checkpoints/a/1",
    "reason": events.REFUSED_LIVE_CONTEXT_PROBED,
    "sandbox_survived": True,
    "effect": "create",
    "seconds": 1.0,
    "route": events.ROUTE_EXEC,
    "pids": "1,7",
    "code": "driver-unsupported",
    "names": ("nvidia.com/gpu=0",),
}


def make_event(event_type: str, actor_id: str = "a", **overrides: object) -> events.Event:
    """An event of ``event_type`` for ``actor_id``, required fields from :data:`DEFAULTS`."""
    cls = events.REGISTRY[event_type]
    kwargs: dict[str, object] = {}
    for f in msgspec.structs.fields(cls):
        if f.name in overrides:
            kwargs[f.name] = overrides[f.name]
        elif f.name in DEFAULTS and f.required:
            kwargs[f.name] = DEFAULTS[f.name]
    return cls(actor_id=actor_id, **kwargs)


async def bring_to_running(agent: Agent, actor_id: str = "a", *, gpu: bool = True) -> None:
    """Register, prepare and run an actor until it runs."""
    await agent.submit(events.ActorRegistered(actor_id=actor_id, gpu=gpu, bundle=f"/b/{actor_id}"))
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}"))
    await agent.submit(events.RunRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "running", timeout=5)
