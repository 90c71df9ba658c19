"""The scenario logs (``*.jsonl``) replay to exactly what the live agent did (``*.expected.json``).

Regenerate both with ``.venv/bin/python tests/scenarios/generate.py`` after a deliberate
change to the machine; a replay that diverges from a scenario is otherwise a regression.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from substrate_gpu.eventlog import read_log, replay
from substrate_gpu.lifecycle.actors import ActorView

HERE = Path(__file__).resolve().parent
SCENARIOS = sorted(p.name.removesuffix(".jsonl") for p in HERE.glob("*.jsonl"))
REQUIRED = {
    "happy_gpu_actor",
    "suspend_refused_then_accepted",
    "checkpoint_failed_by_runtime",
    "restore_on_another_worker",
    "crash_mid_effect_then_recovery",
    "cpu_actor_skips_injection",
    "event_out_of_order_rejected",
}


def _expected(name: str) -> dict[str, object]:
    return json.loads((HERE / f"{name}.expected.json").read_text())  # type: ignore[no-any-return]


def test_every_required_scenario_is_there() -> None:
    """The issue's scenarios each have a log and an expected outcome."""
    assert set(SCENARIOS) >= REQUIRED
    assert all((HERE / f"{name}.expected.json").is_file() for name in SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_replays_to_the_live_final_states(name: str) -> None:
    """Every actor's replayed view equals the live agent's, field for field."""
    result = replay(HERE / f"{name}.jsonl")
    final = {a: msgspec.structs.asdict(view) for a, view in result.actors.items()}
    expected = _expected(name)["final"]
    assert isinstance(expected, dict)
    # A field the view gained after the scenario was recorded holds its default.
    defaults = msgspec.structs.asdict(ActorView("x", "registered", False, "", None, 0, False, None))
    for actor_id, view in final.items():
        for field in set(view) - set(expected.get(actor_id, {})):
            assert view.pop(field) == defaults[field], (actor_id, field)
    assert final == expected
    assert result.torn_tail is None


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_replays_the_live_transition_sequence(name: str) -> None:
    """Every transition, in order, as the live agent's observers saw it; key ones included."""
    seen = [
        [t.actor_id, t.source, t.dest, t.trigger]
        for t in replay(HERE / f"{name}.jsonl").transitions
    ]
    expected = _expected(name)
    assert seen == expected["transitions"]
    it = iter(seen)
    assert all(key in it for key in expected["key_transitions"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_reproduces_its_refusals(name: str) -> None:
    """Refused events are in the log and refused again on replay, in the same state."""
    result = replay(HERE / f"{name}.jsonl")
    assert [[r.actor_id, r.event.type, r.state] for r in result.rejections] == _expected(name)[
        "refusals"
    ]


def test_the_cpu_actor_never_enters_injection() -> None:
    """A CPU actor goes from bundle_prepared straight to creating."""
    states = {t.dest for t in replay(HERE / "cpu_actor_skips_injection.jsonl").transitions}
    assert "injecting" not in states and "running" in states


def test_the_refused_suspend_is_a_reflexive_transition_with_its_reason() -> None:
    """The live-context refusal is recorded: running -> running, with why."""
    transitions = replay(HERE / "suspend_refused_then_accepted.jsonl").transitions
    refused = [t for t in transitions if t.trigger == "suspend_requested" and t.dest == "running"]
    assert len(refused) == 1 and "live CUDA context" in (refused[0].reason or "")


def test_the_recovered_scenario_holds_the_reconciliation_outcomes() -> None:
    """After the crash the log continues: checkpoint_written and sandbox_created, found by
    asking the runtime, are logged like any outcome, in seq order."""
    events = read_log(HERE / "crash_mid_effect_then_recovery.jsonl").events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = [(e.actor_id, e.type) for e in events]
    assert types.index(("gpu-1", "checkpoint_written")) < types.index(("gpu-2", "sandbox_created"))


def test_the_other_workers_checkpoint_is_the_one_restored() -> None:
    """restore_requested names an image from worker-7; the actor's checkpoint is that image."""
    result = replay(HERE / "restore_on_another_worker.jsonl")
    assert result.actors["gpu-1"].checkpoint == "/var/lib/substrate/checkpoints/elsewhere/gpu-1/12"
    assert result.actors["gpu-1"].state == "running"
