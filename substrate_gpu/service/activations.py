"""Which activations of which actor UID the worker hosts, kept as the agent's transitions
happen (the worker API's index; :mod:`.worker_api`).

Each Run or Restore of a UID registers a new actor ``<uid>.<n>`` (docs/worker-api.md, "One
activation, one actor"), and the agent's table keeps every actor it ever registered, deleted
ones included. The worker's lookups are per UID (the live activation, a fresh ``n``) or over
what is live (admission against ``--max-actors``, GetActiveWorkloadStats), so answering them
from the table cost each call O(actors ever registered): a Run at 1,000 live actors, or on a
worker that ran many, paid for every activation that ever was.

So this index holds only what is **live** (not ``deleted``): per UID its live activations,
oldest first, and the highest ``n`` each UID ever had. It is built once from the table (an
agent resumed from its log), then kept by a transition observer, which the agent calls
synchronously for every accepted event, whichever door submitted it (the JSON door may
register an actor with an ``actor_uid`` identity too): a registration carrying an
``actor_uid`` adds its activation, ``deleted`` (a final state) removes it. Every lookup is
then O(1) or O(the UID's live activations), and a pass over what is live is O(live).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from substrate_gpu.lifecycle import Agent, actors, events, hooks
from substrate_gpu.lifecycle.names import State

#: The identity key an activation's UID is kept under (``ActorRegistered.identity``).
UID_KEY: Final = "actor_uid"


def uid_of(view: actors.ActorView) -> str:
    """The UID ``view`` is an activation of; empty for an actor the worker API does not know."""
    return view.identity.get(UID_KEY, "")


def number_of(actor_id: str) -> int:
    """``n`` of an actor ``<uid>.<n>`` (0 for one the JSON door registered otherwise)."""
    suffix = actor_id.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else 0


class Activations:
    """The live activations per UID (see the module doc); kept while the agent runs."""

    def __init__(self, agent: Agent) -> None:
        """Index ``agent``'s table once (O(actors)), then follow its transitions."""
        self._agent = agent
        self._live: dict[str, list[str]] = {}
        """UID -> its live activations' actor ids, by activation number."""
        self._uid: dict[str, str] = {}
        """Live activation -> its UID."""
        self._highest: dict[str, int] = {}
        """UID -> the highest activation number it ever had (deleted ones included)."""
        for view in agent.actors():
            self._add(view)
        agent.add_observer(self._on_transition)

    def close(self) -> None:
        """Stop following the agent (idempotent)."""
        self._agent.remove_observer(self._on_transition)

    # --- kept up to date -----------------------------------------------------------------

    def _add(self, view: actors.ActorView) -> None:
        uid = uid_of(view)
        if not uid:
            return
        n = number_of(view.actor_id)
        self._highest[uid] = max(self._highest.get(uid, 0), n)
        if view.state == State.DELETED:
            return
        live = self._live.setdefault(uid, [])
        live.append(view.actor_id)
        if len(live) > 1:
            live.sort(key=number_of)
        self._uid[view.actor_id] = uid

    def _on_transition(self, t: hooks.Transition) -> None:
        if t.trigger == events.ActorRegistered.type:
            view = self._agent.actor(t.actor_id)
            if view is not None:
                self._add(view)
        elif t.dest == State.DELETED and t.source != t.dest:
            uid = self._uid.pop(t.actor_id, None)
            if uid is not None:
                live = self._live[uid]
                live.remove(t.actor_id)
                if not live:
                    del self._live[uid]

    # --- lookups -------------------------------------------------------------------------

    def live(self, uid: str) -> str | None:
        """The UID's newest live activation, or None (O(1))."""
        ids = self._live.get(uid)
        return ids[-1] if ids else None

    def next_number(self, uid: str) -> int:
        """The ``n`` a new activation of ``uid`` gets: one past the highest it ever had
        (the caller skips an id another door took without the UID's identity)."""
        return self._highest.get(uid, 0) + 1

    def hosted(self) -> int:
        """UIDs with a live activation (O(1))."""
        return len(self._live)

    def is_hosted(self, uid: str) -> bool:
        """Whether ``uid`` has a live activation."""
        return uid in self._live

    def all_live(self) -> Iterator[str]:
        """Every live activation's actor id, ordered by actor id (O(live · log live))."""
        return iter(sorted(self._uid))

    def is_live(self, actor_id: str) -> bool:
        """Whether ``actor_id`` is a live activation."""
        return actor_id in self._uid
