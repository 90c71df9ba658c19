"""Walking the YAML: every transition fires as declared; every other event is refused.

The cases are generated from machines/actor.yaml, so a new transition is tested the day it
is added. The interpreter and the transitions reference engine must both do it.
"""

from __future__ import annotations

import pytest

from lifecycle.factories import make_event
from substrate_gpu.lifecycle import actors, errors, events, machine, table

SPEC = machine.load_spec()
ENGINES = [
    pytest.param(machine.TransitionsEngine, id="transitions"),
    pytest.param(machine.Interpreter, id="interpreter"),
]


def _table(engine: type[table.Engine]) -> table.ActorTable:
    return table.ActorTable(SPEC, engine(SPEC))  # type: ignore[call-arg]


def _actor(state: str, **fields: object) -> actors.ActorView:
    base: dict[str, object] = {
        "actor_id": "a",
        "state": state,
        "gpu": False,
        "bundle": "/bundles/a",
        "checkpoint": None,
        "live_contexts": 0,
        "sandbox": False,
        "reason": None,
    }
    base.update(fields)
    return actors.ActorView(**base)  # type: ignore[arg-type]


def _setup_for(t: machine.TransitionSpec, source: str) -> tuple[actors.ActorView | None, dict]:
    """An actor in ``source`` (None: unknown) and event fields making ``t``'s guards hold."""
    truth = dict.fromkeys(t.conditions, True) | dict.fromkeys(t.unless, False)
    actor_fields: dict[str, object] = {}
    event_fields: dict[str, object] = {}
    if "is_gpu" in truth:
        actor_fields["gpu"] = truth["is_gpu"]
    if "has_live_context" in truth:
        actor_fields["live_contexts"] = 1 if truth["has_live_context"] else 0
    if "context_is_open" in truth:
        actor_fields["live_contexts"] = 1 if truth["context_is_open"] else 0
    if "has_checkpoint" in truth:
        actor_fields["checkpoint"] = "/checkpoints/a/1" if truth["has_checkpoint"] else None
        if t.trigger == "restore_requested" and not truth["has_checkpoint"]:
            event_fields["image_path"] = None
    if "has_exited" in truth:
        actor_fields["exited"] = truth["has_exited"]
    if "allocates_gpus" in truth:
        actor_fields["uses_allocator"] = truth["allocates_gpus"]
    if "allocated_for_restore" in truth:
        actor_fields["gpu_next"] = "restore" if truth["allocated_for_restore"] else "run"
    if "sandbox_survived" in truth:
        event_fields["sandbox_survived"] = truth["sandbox_survived"]
    if "refuses_gpu_suspend" in truth:
        actor_fields["suspend_policy"] = "refuse" if truth["refuses_gpu_suspend"] else "auto"
    if "route_is_runsc" in truth or "route_is_exec" in truth:
        event_fields["route"] = (
            events.ROUTE_RUNSC if truth.get("route_is_runsc") else events.ROUTE_EXEC
        )
    if "suspended_cuda_in_sandbox" in truth:
        actor_fields["suspend_route"] = (
            events.ROUTE_EXEC if truth["suspended_cuda_in_sandbox"] else ""
        )
    if "verifies_gpus" in truth:
        # A GPU actor and an event of an agent that verifies (v2); else a v1 line.
        actor_fields["gpu"] = True
        event_fields["v"] = 2 if truth["verifies_gpus"] else 1
    if "image_has_exec_cuda_state" in truth:
        event_fields["cuda_route"] = events.ROUTE_EXEC if truth["image_has_exec_cuda_state"] else ""
    if source == SPEC.initial:
        return None, event_fields
    return _actor(source, **actor_fields), event_fields


CASES = [
    pytest.param(t, source, id=f"{t.index}-{t.trigger}-{source}->{t.dest_from(source)}")
    for t in SPEC.transitions
    for source in t.sources
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("t", "source"), CASES)
def test_every_transition_fires_as_declared(
    engine: type[table.Engine], t: machine.TransitionSpec, source: str
) -> None:
    """The event moves an actor from the source to the declared dest, and counts follow."""
    actor_table = _table(engine)
    actor, event_fields = _setup_for(t, source)
    if actor is not None:
        actor_table.put(actor)
    step = actor_table.apply(make_event(t.trigger, **event_fields))
    assert (step.source, step.dest) == (source, t.dest_from(source))
    assert actor_table.state_of("a") == t.dest_from(source)
    assert actor_table.state_counts()[t.dest_from(source)] == 1
    assert sum(actor_table.state_counts().values()) == 1


@pytest.mark.parametrize(("t", "source"), CASES)
def test_every_transition_fires_as_declared_when_replayed(
    t: machine.TransitionSpec, source: str
) -> None:
    """Replay applies logged events through the same moves, in one loop: the same dest, and
    the event is noted as what entered the state when the state changed."""
    actor_table = table.ActorTable(SPEC)
    actor, event_fields = _setup_for(t, source)
    if actor is not None:
        actor_table.put(actor)
    event = make_event(t.trigger, **event_fields).stamped(7)
    actor_table.apply_logged([event])
    assert actor_table.state_of("a") == t.dest_from(source)
    assert actor_table.get("a").entered_by is (event if t.dest_from(source) != source else None)
    assert actor_table.state_counts()[t.dest_from(source)] == 1
    assert actor_table.last_seq == 7


INVALID = [
    pytest.param(state, event_type, id=f"{state}-{event_type}")
    for state in SPEC.state_names
    for event_type in sorted(events.REGISTRY)
    if event_type not in SPEC.accepts[state]
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("state", "event_type"), INVALID)
def test_every_invalid_event_is_refused_and_changes_nothing(
    engine: type[table.Engine], state: str, event_type: str
) -> None:
    """An event the state has no transition for raises InvalidEvent; the actor is intact."""
    actor_table = _table(engine)
    if state != SPEC.initial:
        actor_table.put(_actor(state, gpu=True, live_contexts=1, checkpoint="/c", reason="r"))
    before = actor_table.get("a").snapshot() if actor_table.get("a") else None
    counts = actor_table.state_counts()
    with pytest.raises(errors.InvalidEvent) as info:
        actor_table.apply(make_event(event_type))
    assert (info.value.actor_id, info.value.state, info.value.event_type) == (
        "a",
        state,
        event_type,
    )
    assert f"actor 'a' in state '{state}' refused event '{event_type}'" in str(info.value)
    assert (actor_table.get("a").snapshot() if actor_table.get("a") else None) == before
    assert actor_table.state_counts() == counts
    assert actor_table.last_seq == 0


@pytest.mark.parametrize(
    ("state", "event", "fields"),
    [
        pytest.param(
            "running", events.CudaContextClosed(actor_id="a"), {}, id="close-without-open"
        ),
        pytest.param(
            "stopped", events.RestoreRequested(actor_id="a"), {}, id="restore-without-checkpoint"
        ),
    ],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_event_whose_guards_all_fail_is_refused(
    state: str, event: events.Event, fields: dict[str, object], engine: type[table.Engine]
) -> None:
    """A trigger valid in the state but with no guard holding is refused, actor intact."""
    actor_table = _table(engine)
    actor_table.put(_actor(state, **fields))
    before = actor_table.get("a").snapshot()
    with pytest.raises(errors.InvalidEvent, match="no transition's conditions hold"):
        actor_table.apply(event)
    assert actor_table.get("a").snapshot() == before


def test_a_logged_event_the_machine_refuses_names_itself() -> None:
    """Replay's refusal carries the record refused (its line is named from it)."""
    actor_table = table.ActorTable(SPEC)
    actor_table.put(_actor("running"))
    good = events.CudaContextOpened(actor_id="a", pid=7, seq=1)
    bad = events.CudaContextClosed(actor_id="a", pid=8, seq=2)
    with pytest.raises(errors.LoggedEventRefused, match="no transition's conditions hold") as info:
        actor_table.apply_logged([good, bad, good])
    assert info.value.record is bad


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("callback", "event"),
    [
        pytest.param(
            "remember_reason", events.SandboxExited(actor_id="a", status=1), id="unguarded"
        ),
        pytest.param("forget_route", events.SuspendRequested(actor_id="a"), id="guarded"),
    ],
)
def test_a_raising_callback_leaves_the_actor_unchanged(
    monkeypatch: pytest.MonkeyPatch,
    engine: type[table.Engine],
    callback: str,
    event: events.Event,
) -> None:
    """A callback failing mid-transition does not leak partial changes into the actor."""

    def boom(self: actors.Actor, event: events.Event) -> None:
        self.reason = "partial"
        raise RuntimeError("callback bug")

    # Before the engine is built: the interpreter binds callbacks when it compiles.
    monkeypatch.setattr(actors.Actor, callback, boom)
    actor_table = _table(engine)
    actor_table.put(_actor("running", gpu=True))
    before = actor_table.get("a").snapshot()
    with pytest.raises(RuntimeError):
        actor_table.apply(event)
    assert actor_table.get("a").snapshot() == before
    assert actor_table.state_counts()["running"] == 1


def test_accepted_events_are_stamped_in_order() -> None:
    """Each accepted event gets the next sequence number."""
    actor_table = _table(machine.TransitionsEngine)
    first = actor_table.apply(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b"))
    second = actor_table.apply(events.ActorRegistered(actor_id="b", gpu=False, bundle="/b"))
    assert (first.event.seq, second.event.seq) == (1, 2)


def test_entering_an_in_flight_state_names_its_effect() -> None:
    """The step says which effect to start when an in-flight state is entered."""
    actor_table = _table(machine.TransitionsEngine)
    actor_table.put(_actor("bundle_prepared", gpu=True))
    assert actor_table.apply(events.RunRequested(actor_id="a")).effect == "inject"


def test_a_reflexive_transition_starts_no_effect() -> None:
    """Observing a context while checkpointing does not restart the checkpoint."""
    actor_table = _table(machine.TransitionsEngine)
    actor_table.put(_actor("checkpointing", gpu=True))
    step = actor_table.apply(events.CudaContextOpened(actor_id="a"))
    assert (step.dest, step.effect) == ("checkpointing", None)


def test_the_fields_saved_for_undo_are_every_field_in_order() -> None:
    """read_fields (spelt out for speed) reads exactly Actor.FIELDS, in that order."""
    actor = actors.Actor("a", "running")
    for i, name in enumerate(actors.Actor.FIELDS):
        setattr(actor, name, f"value-{i}")
    assert actors.read_fields(actor) == tuple(f"value-{i}" for i in range(len(actors.Actor.FIELDS)))
