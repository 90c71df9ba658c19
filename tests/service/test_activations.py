"""The worker API's index of live activations per UID (:mod:`substrate_gpu.service.activations`):
built once from the agent's table, then kept by its transitions, whichever door caused them;
it holds what is live only, so its lookups never grow with the actors ever registered."""

from __future__ import annotations

from pathlib import Path

import pytest
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime

from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.service import activations

pytestmark = pytest.mark.anyio


def _agent(tmp_path: Path) -> Agent:
    runtime = FakeRuntime()
    return Agent(
        runtime=runtime,
        probe=FakeProbe(runtime),
        injector=FakeInjector(),
        checkpoint_root=tmp_path / "checkpoints",
    )


def _registration(actor_id: str, uid: str | None) -> events.Event:
    identity = {"actor_uid": uid} if uid is not None else {}
    return events.ActorRegistered(
        actor_id=actor_id, gpu=False, bundle=f"/b/{actor_id}", identity=identity
    )


async def _run_and_delete(agent: Agent, actor_id: str, uid: str) -> None:
    await agent.submit(_registration(actor_id, uid))
    await agent.submit(events.DeleteRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "deleted", timeout=5)


@pytest.mark.parametrize(
    ("actor_id", "n"),
    [
        pytest.param("u.3", 3, id="numbered"),
        pytest.param("u.12", 12, id="two-digits"),
        pytest.param("by-hand", 0, id="named-otherwise"),
        pytest.param("u.x", 0, id="not-a-number"),
    ],
)
def test_an_activation_number_is_its_ids_numeric_suffix(actor_id: str, n: int) -> None:
    assert activations.number_of(actor_id) == n


async def test_registrations_with_a_uid_are_live_until_deleted(tmp_path: Path) -> None:
    """Any door's registration carrying an ``actor_uid`` is indexed; ``deleted`` drops it;
    an actor without a UID is not the worker's."""
    async with _agent(tmp_path) as agent:
        index = activations.Activations(agent)
        await agent.submit(_registration("u.1", "u"))
        await agent.submit(_registration("plain", None))
        assert (index.live("u"), index.hosted(), list(index.all_live())) == ("u.1", 1, ["u.1"])
        await agent.submit(events.DeleteRequested(actor_id="u.1"))
        await agent.wait_for_state("u.1", "deleted", timeout=5)
        assert (index.live("u"), index.hosted(), list(index.all_live())) == (None, 0, [])
        assert index.next_number("u") == 2
        index.close()


async def test_the_newest_live_activation_is_the_uids(tmp_path: Path) -> None:
    """Two live activations of one UID (one registered by hand, numbered 0): the highest
    numbered is the live one; the UID is hosted once."""
    async with _agent(tmp_path) as agent:
        index = activations.Activations(agent)
        await agent.submit(_registration("u.2", "u"))
        await agent.submit(_registration("by-hand", "u"))
        assert (index.live("u"), index.hosted(), index.is_hosted("u")) == ("u.2", 1, True)
        assert index.is_live("by-hand") and not index.is_live("u.1")
        index.close()


async def test_an_index_built_on_a_resumed_table_holds_only_the_live(tmp_path: Path) -> None:
    """Built from the table once (an agent resumed from its log): deleted activations count
    only for the next number."""
    async with _agent(tmp_path) as agent:
        for n in range(1, 4):
            await _run_and_delete(agent, f"u.{n}", "u")
        await agent.submit(_registration("u.4", "u"))
        index = activations.Activations(agent)
        assert list(index.all_live()) == ["u.4"]
        assert index.next_number("u") == 5
        assert index.next_number("never") == 1
        index.close()
