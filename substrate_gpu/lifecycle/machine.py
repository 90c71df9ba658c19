"""Loading ``machines/actor.yaml``: validation, the transitions ``Machine``, the diagram.

The YAML is the single source of the lifecycle. :func:`load_spec` reads and checks it and
fails fast, naming the file and the entry, on anything transitions would only discover
when the transition fires (a misspelt callback fails *after* the state changed): unknown
states, conditions or callbacks, triggers that are not event types, event types without
a transition, unreachable states, dead ends, in-flight states that do not accept every
outcome of their effect, and any difference between the YAML and the typed names of
:mod:`.names` (states, triggers, effects) or the effect registry (:mod:`.registry`).

One interpreter evaluates the spec: :class:`Interpreter`, a dict table built from it
(``spec.interpreter``), used by the live pipeline, replay and recovery alike.
:class:`TransitionsEngine` (transitions' **synchronous** ``Machine``; not ``AsyncMachine``,
which swallows cancellation and timeouts, lets overlapping triggers cancel each other and
runs callback lists concurrently: brief §8) is the reference it is proven equal to by the
property tests over random event streams; it also renders the diagram.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from substrate_gpu.lifecycle import actors, errors, events, names, registry, table

#: Where ``machines/actor.yaml`` is found, in order: a source checkout (the repository
#: root's ``machines/``, also what an editable install sees), then the copy a wheel installs
#: under ``<prefix>/share/substrate-gpu/machines/`` (pyproject's data-files). One file, two
#: places it can be read from; never two sources of truth.
MACHINE_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "machines" / "actor.yaml",
    Path(sys.prefix) / "share" / "substrate-gpu" / "machines" / "actor.yaml",
)
DEFAULT_MACHINE = next((p for p in MACHINE_CANDIDATES if p.is_file()), MACHINE_CANDIDATES[0])

#: Format of the compiled form (:func:`compiled_path`).
COMPILED_FORMAT = "substrate-gpu-machine-compiled"


def _quiet_transitions() -> None:
    """transitions logs every trigger at INFO: far too chatty for 100k actors. Set where
    transitions is used (the reference engine, the diagram): replay and the live path never
    import it, nor logging."""
    import logging  # noqa: PLC0415

    logging.getLogger("transitions").setLevel(logging.WARNING)


@dataclass(frozen=True)
class StateSpec:
    """One state of the YAML."""

    name: str
    effect: str | None = None
    """The effect the pipeline starts on entering the state (an "in flight" state)."""
    final: bool = False
    """No way out (deleted)."""
    description: str = ""
    holds_gpus: bool = False
    """An actor here keeps the GPUs allocated to it; entering another state frees them."""
    may_leave_sandbox: bool = False
    """Entered from a ``holds_gpus`` state, a sandbox of the actor may still run (a failed,
    timed-out or interrupted effect): its GPUs stay held until the pipeline has deleted
    what is left and the runtime shows none of its containers."""


@dataclass(frozen=True)
class TransitionSpec:
    """One transition entry of the YAML (``dest`` None means reflexive, ``"="``)."""

    index: int
    """Position in the YAML's transitions list (for error messages)."""
    trigger: str
    sources: tuple[str, ...]
    dest: str | None
    conditions: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def dest_from(self, source: str) -> str:
        """The state reached from ``source``."""
        return source if self.dest is None else self.dest

    def label(self) -> str:
        """``trigger: a, b -> dest`` for messages."""
        return f"{self.trigger}: {', '.join(self.sources)} -> {self.dest or '='}"


@dataclass(frozen=True)
class MachineSpec:
    """The validated lifecycle."""

    path: Path
    name: str
    initial: str
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    _by_source_trigger: dict[tuple[str, str], tuple[TransitionSpec, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @cached_property
    def state_names(self) -> tuple[str, ...]:
        """Every state, in YAML order."""
        return tuple(s.name for s in self.states)

    @cached_property
    def effects(self) -> Mapping[str, str]:
        """State name -> effect name, for in-flight states."""
        return {s.name: s.effect for s in self.states if s.effect}

    @cached_property
    def final_states(self) -> frozenset[str]:
        """States with no way out."""
        return frozenset(s.name for s in self.states if s.final)

    @cached_property
    def accepts(self) -> Mapping[str, frozenset[str]]:
        """State name -> the triggers it has a transition for."""
        out: dict[str, set[str]] = {s: set() for s in self.state_names}
        for t in self.transitions:
            for source in t.sources:
                out[source].add(t.trigger)
        return {s: frozenset(triggers) for s, triggers in out.items()}

    @cached_property
    def gpu_holding_states(self) -> frozenset[str]:
        """States in which an actor keeps its allocated GPUs (``holds_gpus``)."""
        return frozenset(s.name for s in self.states if s.holds_gpus)

    @cached_property
    def sandbox_leaving_states(self) -> frozenset[str]:
        """States entered with a sandbox that may still run (``may_leave_sandbox``)."""
        return frozenset(s.name for s in self.states if s.may_leave_sandbox)

    @cached_property
    def in_flight_states(self) -> frozenset[str]:
        """States that run an effect (an actor only passes through them)."""
        return frozenset(self.effects)

    @cached_property
    def reachable_unaided(self) -> Mapping[str, frozenset[str]]:
        """State name -> the states an actor there can reach with no further external event
        (itself included): through its effects' outcomes and the agent's own events
        (``gpus_freed``), whatever their conditions. What ``wait_for_state`` uses to stop
        waiting for a state an actor at rest can no longer reach."""
        internal = {t for t, cls in events.REGISTRY.items() if not cls.external}
        step: dict[str, set[str]] = {s: set() for s in self.state_names}
        for t in self.transitions:
            if t.trigger in internal:
                for source in t.sources:
                    step[source].add(t.dest_from(source))
        out: dict[str, frozenset[str]] = {}
        for start in self.state_names:
            seen = {start}
            todo = deque([start])
            while todo:
                for dest in step[todo.popleft()]:
                    if dest not in seen:
                        seen.add(dest)
                        todo.append(dest)
            out[start] = frozenset(seen)
        return out

    @cached_property
    def interpreter(self) -> Interpreter:
        """The evaluation of this spec (one per spec, shared)."""
        return Interpreter(self)

    def candidates(self, source: str, trigger: str) -> tuple[TransitionSpec, ...]:
        """The transitions of ``trigger`` from ``source``, in the order they are tried."""
        return self._by_source_trigger.get((source, trigger), ())

    def guard_summary(self, source: str, trigger: str) -> str:
        """Why no transition of ``trigger`` fired from ``source`` (for InvalidEvent)."""
        guards = []
        for t in self.candidates(source, trigger):
            parts = [*t.conditions, *(f"not {u}" for u in t.unless)]
            guards.append(f"[{' and '.join(parts)}] -> {t.dest_from(source)}")
        return "no transition's conditions hold: " + "; ".join(guards)


def _fail(path: Path, where: str, problem: str) -> errors.MachineDefinitionError:
    return errors.MachineDefinitionError(f"invalid lifecycle machine {path}: {where}: {problem}")


def _names(raw: object, path: Path, where: str, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return tuple(cast("list[str]", raw))
    raise _fail(path, where, f"{key} must be a name or a list of names, got {raw!r}")


def compiled_path(path: Path) -> Path:
    """The compiled form of the machine at ``path``: ``actor.yaml`` -> ``actor.compiled.json``.

    The YAML parsed once, as JSON, beside the YAML text it came from. Importing and running
    PyYAML would cost every command that replays a log (``replay``, the agent's recovery)
    far more than reading the JSON does (tests/bench/README.md, "Figures behind design
    choices"). It is used only when the text it records is the YAML's text exactly, so an
    edited YAML is never shadowed by an old compiled form (it is then parsed as YAML:
    slower, never wrong), and a test fails while it is out of date (``python -m
    substrate_gpu.lifecycle.diagram`` rewrites it).
    """
    return path.with_name(path.name.removesuffix(".yaml") + ".compiled.json")


def compile_spec(text: str, document: object) -> str:
    """The compiled form's text for the YAML ``text`` parsed as ``document``.

    Raises :class:`~substrate_gpu.lifecycle.errors.MachineDefinitionError` when the document
    does not survive JSON unchanged (a YAML date or a non-string key would)."""
    body = {"format": COMPILED_FORMAT, "source": text, "document": document}
    encoded = json.dumps(body, indent=1, sort_keys=True) + "\n"
    if json.loads(encoded)["document"] != document:
        raise errors.MachineDefinitionError(
            "the lifecycle machine holds values JSON cannot carry unchanged; keep it to "
            "strings, numbers, booleans, lists and string-keyed mappings"
        )
    return encoded


def _compiled_document(path: Path, text: str) -> object | None:
    """The document of ``path``'s compiled form when it was compiled from ``text``."""
    try:
        body = json.loads(compiled_path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("format") != COMPILED_FORMAT:
        return None
    return body.get("document") if body.get("source") == text else None


def read_yaml(path: Path, text: str) -> object:
    """``text`` (the machine at ``path``) parsed as YAML."""
    import yaml  # noqa: PLC0415 - only when there is no current compiled form

    from substrate_gpu import _yaml  # noqa: PLC0415

    try:
        return _yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _fail(path, "YAML", str(e)) from e


def load_spec(path: Path = DEFAULT_MACHINE) -> MachineSpec:
    """Read and validate the lifecycle YAML at ``path`` (through its compiled form when
    that is current: :func:`compiled_path`). Validation runs on either."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise errors.MachineDefinitionError(
            f"cannot read lifecycle machine {path}: {e.strerror or e}"
        ) from e
    raw = _compiled_document(path, text)
    if raw is None:
        raw = read_yaml(path, text)
    return parse_spec(raw, path)


def parse_spec(raw: object, path: Path) -> MachineSpec:
    """Validate an already parsed YAML document (``path`` names it in errors)."""
    if not isinstance(raw, dict):
        raise _fail(path, "top level", "must be a mapping with initial, states, transitions")
    unknown_keys = set(raw) - {"name", "initial", "states", "transitions"}
    if unknown_keys:
        raise _fail(path, "top level", f"unknown key(s) {sorted(unknown_keys)}")

    states: list[StateSpec] = []
    raw_states = raw.get("states")
    if not isinstance(raw_states, list) or not raw_states:
        raise _fail(path, "states", "must be a non-empty list")
    for i, entry in enumerate(raw_states):
        where = f"states[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _fail(path, where, "must be a mapping with a string name")
        extra = set(entry) - {
            "name",
            "effect",
            "final",
            "description",
            "holds_gpus",
            "may_leave_sandbox",
        }
        if extra:
            raise _fail(path, f"{where} ({entry['name']})", f"unknown key(s) {sorted(extra)}")
        effect = entry.get("effect")
        if effect is not None and effect not in registry.REGISTRY:
            raise _fail(
                path,
                f"{where} ({entry['name']})",
                f"unknown effect {effect!r}; known: {', '.join(sorted(registry.REGISTRY))}",
            )
        states.append(
            StateSpec(
                name=entry["name"],
                effect=effect,
                final=bool(entry.get("final", False)),
                description=str(entry.get("description", "")),
                holds_gpus=bool(entry.get("holds_gpus", False)),
                may_leave_sandbox=bool(entry.get("may_leave_sandbox", False)),
            )
        )
    names = [s.name for s in states]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise _fail(path, "states", f"duplicate state(s) {sorted(duplicates)}")
    known = set(names)

    initial = raw.get("initial")
    if initial not in known:
        raise _fail(path, "initial", f"{initial!r} is not a declared state")

    transitions: list[TransitionSpec] = []
    raw_transitions = raw.get("transitions")
    if not isinstance(raw_transitions, list) or not raw_transitions:
        raise _fail(path, "transitions", "must be a non-empty list")
    for i, entry in enumerate(raw_transitions):
        where = f"transitions[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("trigger"), str):
            raise _fail(path, where, "must be a mapping with a string trigger")
        extra = set(entry) - {"trigger", "source", "dest", "conditions", "unless", "after"}
        if extra:
            raise _fail(path, where, f"unknown key(s) {sorted(extra)}")
        dest_raw = entry.get("dest")
        if not isinstance(dest_raw, str):
            raise _fail(path, where, "dest must be a state name or '='")
        t = TransitionSpec(
            index=i,
            trigger=entry["trigger"],
            sources=_names(entry.get("source"), path, where, "source"),
            dest=None if dest_raw == "=" else dest_raw,
            conditions=_names(entry.get("conditions"), path, where, "conditions"),
            unless=_names(entry.get("unless"), path, where, "unless"),
            after=_names(entry.get("after"), path, where, "after"),
        )
        where = f"{where} ({t.label()})"
        if t.trigger not in events.REGISTRY:
            raise _fail(path, where, f"trigger {t.trigger!r} is not an event type")
        if not t.sources:
            raise _fail(path, where, "has no source")
        for state in (*t.sources, *([t.dest] if t.dest else [])):
            if state not in known:
                raise _fail(path, where, f"unknown state {state!r}")
        for name in (*t.conditions, *t.unless):
            if name not in actors.CONDITIONS:
                raise _fail(
                    path,
                    where,
                    f"unknown condition {name!r}; known: {', '.join(sorted(actors.CONDITIONS))}",
                )
        for name in t.after:
            if name not in actors.CALLBACKS:
                raise _fail(
                    path,
                    where,
                    f"unknown callback {name!r}; known: {', '.join(sorted(actors.CALLBACKS))}",
                )
        transitions.append(t)

    by_source_trigger: dict[tuple[str, str], list[TransitionSpec]] = {}
    for t in transitions:
        for source in t.sources:
            by_source_trigger.setdefault((source, t.trigger), []).append(t)
    spec = MachineSpec(
        path=path,
        name=str(raw.get("name", path.stem)),
        initial=initial,
        states=tuple(states),
        transitions=tuple(transitions),
        _by_source_trigger={k: tuple(v) for k, v in by_source_trigger.items()},
    )
    _check_graph(spec)
    _check_names(spec)
    return spec


def _differ(kind: str, yaml_side: set[str], code_side: set[str], code: str) -> str | None:
    only_yaml, only_code = sorted(yaml_side - code_side), sorted(code_side - yaml_side)
    if not only_yaml and not only_code:
        return None
    return (
        f"its {kind} differ from {code}: only in the YAML {only_yaml}, only in the code {only_code}"
    )


def _check_names(spec: MachineSpec) -> None:
    """The YAML, the typed names and the effect registry describe the same machine."""
    checks = (
        ("states", set(spec.state_names), {str(s) for s in names.State}, "names.State"),
        ("effects", set(spec.effects.values()), {str(e) for e in names.Effect}, "names.Effect"),
        (
            "effects",
            set(spec.effects.values()),
            {str(e) for e in registry.REGISTRY},
            "the effect registry (lifecycle/registry.py)",
        ),
    )
    for kind, yaml_side, code_side, code in checks:
        problem = _differ(kind, yaml_side, code_side, code)
        if problem is not None:
            raise _fail(spec.path, kind, problem)
    problems = registry.check_registry()
    if problems:
        raise _fail(spec.path, "effect registry", "; ".join(problems))


def _check_graph(spec: MachineSpec) -> None:
    path = spec.path
    used = {t.trigger for t in spec.transitions}
    unused = sorted(set(events.REGISTRY) - used)
    if unused:
        raise _fail(path, "transitions", f"event type(s) without a transition: {unused}")

    reachable = {spec.initial}
    todo = deque([spec.initial])
    while todo:
        state = todo.popleft()
        for t in spec.transitions:
            if state in t.sources:
                dest = t.dest_from(state)
                if dest not in reachable:
                    reachable.add(dest)
                    todo.append(dest)
    unreachable = [s for s in spec.state_names if s not in reachable]
    if unreachable:
        raise _fail(path, "states", f"unreachable from {spec.initial!r}: {unreachable}")

    for st in spec.states:
        leaves = any(
            st.name in t.sources and t.dest_from(st.name) != st.name for t in spec.transitions
        )
        if st.final and leaves:
            raise _fail(path, f"state {st.name}", "is final but has transitions out")
        if not st.final and not leaves:
            raise _fail(path, f"state {st.name}", "is a dead end (not final, no way out)")
        if st.effect:
            missing = [
                str(o)
                for o in registry.REGISTRY[st.effect].outcomes
                if o not in spec.accepts[st.name]
            ]
            if missing:
                raise _fail(
                    path,
                    f"state {st.name}",
                    f"its effect {st.effect!r} can produce {missing}, which it does not accept",
                )


def _machine_config(spec: MachineSpec) -> dict[str, Any]:
    transitions: list[dict[str, Any]] = []
    for t in spec.transitions:
        entry: dict[str, Any] = {
            "trigger": t.trigger,
            "source": list(t.sources),
            "dest": "=" if t.dest is None else t.dest,
        }
        if t.conditions:
            entry["conditions"] = list(t.conditions)
        if t.unless:
            entry["unless"] = list(t.unless)
        if t.after:
            entry["after"] = list(t.after)
        transitions.append(entry)
    return {
        "states": list(spec.state_names),
        "transitions": transitions,
        "initial": spec.initial,
        "auto_transitions": False,
        "send_event": False,
        # Validity is checked against the spec before firing, with a better message.
        "ignore_invalid_triggers": True,
    }


class TransitionsEngine:
    """The reference: transitions' synchronous ``Machine`` firing triggers on the actor.

    Not used by the agent, replay or recovery (they use :class:`Interpreter`); the property
    tests run random event streams through both and require identical results.
    """

    def __init__(self, spec: MachineSpec) -> None:
        # model=None: no model is registered (no add_model scan, no bound trigger partials);
        # Event.trigger(actor, event) works on any object with a ``state`` attribute and
        # passes the event on to every condition and callback.
        from transitions import Machine  # noqa: PLC0415 - the reference, not the live path

        _quiet_transitions()
        self.machine = Machine(model=None, **_machine_config(spec))
        self._triggers: dict[str, Callable[[actors.Actor, events.Event], bool]] = {
            name: event.trigger for name, event in self.machine.events.items()
        }
        self.moves = table.moves_from_fire(spec, self.fire)
        """Every accepted ``(state, trigger)`` fires through transitions."""

    def fire(self, actor: actors.Actor, event: events.Event) -> bool:
        """Fire ``event``'s trigger on ``actor``; False when no transition's conditions held."""
        return self._triggers[event.type](actor, event)


_Test = Callable[[actors.Actor, events.Event], bool]
_Callback = Callable[[actors.Actor, events.Event], None]
_Candidate = tuple[tuple[_Test, ...], tuple[_Test, ...], str | None, tuple[_Callback, ...]]


class Interpreter:
    """THE evaluation of the machine: for every ``(state, trigger)`` the spec accepts, one
    :data:`~substrate_gpu.lifecycle.table.Move` over that entry's transitions, their
    conditions and callbacks bound to :class:`Actor`'s functions once.

    For the ``(state, trigger)``, the spec's transitions are tried in YAML order; the first
    whose ``conditions`` all hold and whose ``unless`` all fail sets ``dest`` (``=``: kept)
    and runs its ``after`` callbacks, as transitions' ``Machine`` does. The live pipeline,
    replay and recovery all use it (through :class:`~substrate_gpu.lifecycle.table.ActorTable`).

    A plain loop over the entry's transitions: closures specialised to each entry's shape,
    decision tables and an undo-free table for replay were measured against it and did not
    pay (neither agent events/s nor recovery of a 1,000,000-event log moved enough;
    docs/architecture.md has the figures).
    """

    def __init__(self, spec: MachineSpec) -> None:
        actor = actors.Actor
        self.moves: dict[str, dict[type[events.Event], table.Move]] = {
            source: {
                events.REGISTRY[trigger]: _move(
                    tuple(
                        (
                            tuple(getattr(actor, name) for name in t.conditions),
                            tuple(getattr(actor, name) for name in t.unless),
                            t.dest,
                            tuple(getattr(actor, name) for name in t.after),
                        )
                        for t in spec.candidates(source, trigger)
                    )
                )
                for trigger in sorted(spec.accepts[source])
            }
            for source in spec.state_names
        }
        """State -> event class (its trigger) -> its move."""


def _move(candidates: tuple[_Candidate, ...]) -> table.Move:
    """One ``(state, trigger)``'s move: the first of ``candidates`` whose guards hold enters
    its dest and runs its callbacks (True); none holds: nothing changes (False). Undoing a
    raising callback is the caller's (:meth:`ActorTable.advance`)."""

    def move(actor: actors.Actor, event: events.Event) -> bool:
        for conditions, unless, dest, after in candidates:
            if _holds(conditions, unless, actor, event):
                if dest is not None:
                    actor.state = dest
                for callback in after:
                    callback(actor, event)
                return True
        return False

    return move


def _holds(
    conditions: tuple[_Test, ...],
    unless: tuple[_Test, ...],
    actor: actors.Actor,
    event: events.Event,
) -> bool:
    """Every one of ``conditions`` holds and none of ``unless`` does (conditions only read)."""
    for test in conditions:
        if not test(actor, event):
            return False
    for test in unless:  # noqa: SIM110 (a loop: any() over a generator is slower)
        if test(actor, event):
            return False
    return True


def render_mermaid(spec: MachineSpec) -> str:
    """The mermaid state diagram of ``spec``, as transitions' mermaid backend renders it."""
    from transitions.extensions.diagrams import GraphMachine  # noqa: PLC0415 (docs only)

    _quiet_transitions()

    class _Model:
        """A throwaway model: the diagram only needs a state attribute."""

    model = _Model()
    config = _machine_config(spec)
    GraphMachine(
        model=model,
        graph_engine="mermaid",
        show_conditions=True,
        title=f"{spec.name} lifecycle ({spec.path.name})",
        **config,
    )
    graph = model.get_graph()  # type: ignore[attr-defined]
    return str(graph.source).rstrip() + "\n"
