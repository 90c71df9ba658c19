"""The effect registry: one entry per effect, consistent with the machine and the metrics."""

from __future__ import annotations

import itertools

import pytest

from substrate_gpu.eventlog.replayer import Replayer
from substrate_gpu.lifecycle import actors, events, machine, registry
from substrate_gpu.observability import metrics

SPEC = machine.load_spec()


def test_the_registry_has_exactly_the_machines_effects() -> None:
    """One entry per effect a state of machines/actor.yaml starts, no more."""
    assert set(registry.REGISTRY) == set(SPEC.effects.values())


def test_the_registry_is_internally_consistent() -> None:
    """Failure and success outcomes are among each effect's outcomes, all outcome events."""
    assert registry.check_registry() == []


@pytest.mark.parametrize(
    ("state", "exited", "exec_route"),
    [
        pytest.param(state, exited, exec_route, id=f"{state}-exited={exited}-exec={exec_route}")
        for state, exited, exec_route in itertools.product(
            sorted(SPEC.in_flight_states), (False, True), (False, True)
        )
    ],
)
def test_every_failure_outcome_is_accepted_in_its_effects_state(
    state: str, exited: bool, exec_route: bool
) -> None:
    """The failure outcome (pipeline's unexpected error, recovery's unreadable runtime)
    always lands on a transition, whatever the actor's flags."""
    view = actors.ActorView(
        "a", state, True, "/b", "/ck/1", 1, True, None, exited=exited,
        suspend_route=events.ROUTE_EXEC if exec_route else "", cuda_pids="7",
    )  # fmt: skip
    replayer = Replayer(SPEC)
    replayer.load_views([view], 10)
    outcome = registry.failure_outcome(SPEC.effects[state], view, "boom")
    source, dest, _ = replayer.apply(outcome)
    # It leaves the state (a failed CUDA suspend goes on to resume what it touched).
    assert source == state != dest


def test_an_unknown_effects_failure_is_the_outcome_every_in_flight_state_accepts() -> None:
    """A newer machine's effect fails as effect_timed_out."""
    view = actors.ActorView("a", "x", True, "/b", None, 0, True, None)
    assert registry.failure_outcome("teleport", view, "boom").type == "effect_timed_out"


def test_every_effect_is_timed_in_a_known_histogram_and_ends_with_a_known_label() -> None:
    """No effect's duration or outcome lands in the metrics' ``other`` label."""
    for effect in registry.REGISTRY.values():
        assert effect.metric_label in metrics.INJECTION_EFFECTS | metrics.RUNTIME_EFFECTS
        assert set(effect.outcomes.values()) <= metrics.OUTCOMES
