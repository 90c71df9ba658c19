"""Loading machines/actor.yaml: validation fails fast, naming the file and the entry."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from substrate_gpu.lifecycle import actors, diagram, errors, events, machine

YAML = machine.DEFAULT_MACHINE
RAW: dict[str, Any] = yaml.safe_load(YAML.read_text())


def _transition(raw: dict[str, Any], trigger: str) -> dict[str, Any]:
    return next(t for t in raw["transitions"] if t["trigger"] == trigger)


def _state(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in raw["states"] if s["name"] == name)


def test_the_machine_loads() -> None:
    """The checked-in YAML is valid and declares the states the brief requires."""
    spec = machine.load_spec()
    required = {
        "registered", "bundle_prepared", "injecting", "creating", "running", "checkpointing",
        "suspended", "restoring", "stopped", "failed", "deleted",
    }  # fmt: skip
    assert required <= set(spec.state_names)


@pytest.mark.parametrize(
    ("state", "reaches", "never"),
    [
        pytest.param("creating", {"running", "failed", "stopped"}, {"suspended"}, id="creating"),
        pytest.param("awaiting_gpus", {"running"}, {"deleted"}, id="awaiting-gpus-by-gpus-freed"),
        pytest.param("failed", {"failed"}, {"running"}, id="failed-needs-a-retry"),
        pytest.param("running", {"running"}, {"suspended"}, id="running-needs-a-suspend"),
        pytest.param("deleting", {"deleted", "failed"}, {"running"}, id="deleting"),
    ],
)
def test_reachable_unaided_follows_only_the_machines_own_events(
    state: str, reaches: set[str], never: set[str]
) -> None:
    """Effect outcomes and the agent's own events (gpus_freed) move an actor on; a client's
    events (retry_requested, suspend_requested) do not count."""
    reachable = machine.load_spec().reachable_unaided[state]
    assert state in reachable and reaches <= reachable and not never & reachable


def test_the_transitions_logger_is_quiet() -> None:
    """Building the reference engine (where transitions is used) sets its logger to WARNING."""
    logging.getLogger("transitions").setLevel(logging.NOTSET)
    machine.TransitionsEngine(machine.load_spec())
    assert logging.getLogger("transitions").level == logging.WARNING


def test_every_condition_and_callback_is_an_actor_method() -> None:
    """Every name the YAML may use is a method of Actor (conditions and callbacks alike)."""
    assert {"is_gpu", "context_is_open"} <= actors.CONDITIONS
    assert {"remember_reason", "new_sandbox"} <= actors.CALLBACKS
    for name in actors.CONDITIONS | actors.CALLBACKS:
        assert callable(getattr(actors.Actor, name)), name


def _edit_unknown_callback(raw: dict[str, Any]) -> None:
    _transition(raw, "sandbox_created")["after"] = ["remember_sandbx"]


def _edit_unknown_condition(raw: dict[str, Any]) -> None:
    _transition(raw, "run_requested")["conditions"] = ["is_gpuu"]


def _edit_unknown_dest(raw: dict[str, Any]) -> None:
    _transition(raw, "sandbox_started")["dest"] = "runing"


def _edit_unknown_source(raw: dict[str, Any]) -> None:
    _transition(raw, "sandbox_started")["source"] = "startin"


def _edit_unknown_trigger(raw: dict[str, Any]) -> None:
    _transition(raw, "sandbox_started")["trigger"] = "sandbox_begun"


def _edit_unreachable_state(raw: dict[str, Any]) -> None:
    raw["states"].append({"name": "limbo", "final": True})


def _edit_dead_end(raw: dict[str, Any]) -> None:
    raw["states"].append({"name": "stuck"})
    raw["transitions"].append({"trigger": "sandbox_exited", "source": "running", "dest": "stuck"})


def _edit_effect_outcome_not_accepted(raw: dict[str, Any]) -> None:
    raw["transitions"] = [t for t in raw["transitions"] if t["trigger"] != "injection_failed"]
    raw["transitions"].append(
        {"trigger": "injection_failed", "source": "creating", "dest": "failed"}
    )


def _edit_unknown_effect(raw: dict[str, Any]) -> None:
    _state(raw, "creating")["effect"] = "craete"


def _edit_state_not_in_names(raw: dict[str, Any]) -> None:
    """Rename ``stopped`` everywhere: a consistent machine, but not the one the code names."""
    for state in raw["states"]:
        if state["name"] == "stopped":
            state["name"] = "halted"
    for t in raw["transitions"]:
        sources = t["source"] if isinstance(t["source"], list) else [t["source"]]
        t["source"] = ["halted" if s == "stopped" else s for s in sources]
        if t["dest"] == "stopped":
            t["dest"] = "halted"


def _edit_effect_not_in_names(raw: dict[str, Any]) -> None:
    """A state stops running its effect: the code's effects are no longer all in the YAML."""
    del _state(raw, "cuda_resuming")["effect"]


def _edit_unknown_initial(raw: dict[str, Any]) -> None:
    raw["initial"] = "nowhere"


def _edit_unknown_key(raw: dict[str, Any]) -> None:
    _transition(raw, "sandbox_started")["before"] = ["clear_reason"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(_edit_unknown_callback, "unknown callback 'remember_sandbx'", id="callback"),
        pytest.param(_edit_unknown_condition, "unknown condition 'is_gpuu'", id="condition"),
        pytest.param(_edit_unknown_dest, "unknown state 'runing'", id="dest"),
        pytest.param(_edit_unknown_source, "unknown state 'startin'", id="source"),
        pytest.param(_edit_unknown_trigger, "'sandbox_begun' is not an event type", id="trigger"),
        pytest.param(
            _edit_unreachable_state, "unreachable from 'new': ['limbo']", id="unreachable"
        ),
        pytest.param(_edit_dead_end, "state stuck: is a dead end", id="dead-end"),
        pytest.param(
            _edit_effect_outcome_not_accepted,
            "['injection_failed'], which it does not accept",
            id="effect-outcome",
        ),
        pytest.param(_edit_unknown_effect, "unknown effect 'craete'", id="effect"),
        pytest.param(
            _edit_state_not_in_names,
            "states differ from names.State: only in the YAML ['halted'], only in the code "
            "['stopped']",
            id="state-not-named",
        ),
        pytest.param(
            _edit_effect_not_in_names,
            "effects differ from names.Effect: only in the YAML [], only in the code "
            "['cuda_resume']",
            id="effect-not-named",
        ),
        pytest.param(_edit_unknown_initial, "'nowhere' is not a declared state", id="initial"),
        pytest.param(_edit_unknown_key, "unknown key(s) ['before']", id="key"),
    ],
)
def test_invalid_machine_is_refused_at_load(edit: Any, expected: str) -> None:
    """A broken machine fails at load with the file, the entry and the problem named."""
    raw = copy.deepcopy(RAW)
    edit(raw)
    with pytest.raises(errors.MachineDefinitionError) as info:
        machine.parse_spec(raw, YAML)
    assert str(YAML) in str(info.value)
    assert expected in str(info.value)


def test_refusal_names_the_transition() -> None:
    """The error for a bad transition names its trigger, sources and dest."""
    raw = copy.deepcopy(RAW)
    _edit_unknown_callback(raw)
    with pytest.raises(
        errors.MachineDefinitionError, match=r"sandbox_created: creating -> starting"
    ):
        machine.parse_spec(raw, YAML)


def test_an_event_type_without_transition_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event type must have a transition (no event silently ignored)."""
    raw = copy.deepcopy(RAW)
    raw["transitions"] = [t for t in raw["transitions"] if t["trigger"] != "retry_requested"]
    with pytest.raises(
        errors.MachineDefinitionError, match="without a transition: \\['retry_requested'\\]"
    ):
        machine.parse_spec(raw, YAML)


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    """A missing machine file is reported with its path."""
    with pytest.raises(errors.MachineDefinitionError, match="cannot read lifecycle machine"):
        machine.load_spec(tmp_path / "nope.yaml")


def test_every_trigger_is_an_event_and_every_event_a_trigger() -> None:
    """Triggers and event types are the same set."""
    spec = machine.load_spec()
    assert {t.trigger for t in spec.transitions} == set(events.REGISTRY)


def test_checked_in_diagram_is_current() -> None:
    """docs/lifecycle.mmd is what transitions renders from the YAML today."""
    rendered = machine.render_mermaid(machine.load_spec())
    assert diagram.MMD.read_text() == rendered, (
        "docs/lifecycle.mmd is stale: run python -m substrate_gpu.lifecycle.diagram"
    )


def test_architecture_doc_embeds_the_current_diagram() -> None:
    """docs/architecture.md embeds the same diagram."""
    rendered = machine.render_mermaid(machine.load_spec())
    text = diagram.ARCHITECTURE.read_text()
    assert diagram.embed(text, rendered) == text, (
        "the diagram in docs/architecture.md is stale: run python -m substrate_gpu.lifecycle.diagram"
    )


def test_diagram_is_mermaid_from_transitions() -> None:
    """The rendering is a mermaid state diagram with guards on the edges."""
    rendered = machine.render_mermaid(machine.load_spec())
    assert "stateDiagram-v2" in rendered
    assert "running --> checkpointing: suspend_requested [!is_gpu & !has_live_context]" in rendered
    assert "running --> probing: suspend_requested [is_gpu & !refuses_gpu_suspend]" in rendered
    assert "suspend_requested [has_live_context & !is_gpu]" in rendered


def test_checked_in_compiled_machine_is_current() -> None:
    """machines/actor.compiled.json is what the YAML compiles to today."""
    path = machine.compiled_path(machine.DEFAULT_MACHINE)
    assert path.read_text(encoding="utf-8") == diagram.compiled(), (
        f"{path} is stale: run python -m substrate_gpu.lifecycle.diagram"
    )


def test_the_compiled_form_spares_pyyaml() -> None:
    """With a current compiled form, loading the machine never imports PyYAML."""
    code = (
        "import sys\n"
        "from substrate_gpu.lifecycle import machine\n"
        "spec = machine.load_spec()\n"
        "assert spec.initial == 'new', spec.initial\n"
        "print(sorted(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def _copy_machine(tmp_path: Path) -> Path:
    yaml_copy = tmp_path / "actor.yaml"
    yaml_copy.write_bytes(machine.DEFAULT_MACHINE.read_bytes())
    machine.compiled_path(yaml_copy).write_bytes(
        machine.compiled_path(machine.DEFAULT_MACHINE).read_bytes()
    )
    return yaml_copy


def test_an_edited_yaml_is_never_shadowed_by_its_old_compiled_form(tmp_path: Path) -> None:
    """The compiled form is used only for the very text it was compiled from."""
    yaml_copy = _copy_machine(tmp_path)
    text = yaml_copy.read_text(encoding="utf-8")
    marker = "description: The sandbox runs."
    assert marker in text
    yaml_copy.write_text(text.replace(marker, "description: Edited, not compiled."), "utf-8")
    spec = machine.load_spec(yaml_copy)
    assert next(s for s in spec.states if s.name == "running").description == (
        "Edited, not compiled."
    )


def test_the_compiled_document_is_what_load_spec_uses(tmp_path: Path) -> None:
    """A current compiled form is read instead of the YAML (its document, not the text)."""
    yaml_copy = _copy_machine(tmp_path)
    compiled = machine.compiled_path(yaml_copy)
    body = json.loads(compiled.read_text(encoding="utf-8"))
    for state in body["document"]["states"]:
        if state["name"] == "running":
            state["description"] = "From the compiled form."
    compiled.write_text(json.dumps(body), encoding="utf-8")
    spec = machine.load_spec(yaml_copy)
    assert next(s for s in spec.states if s.name == "running").description == (
        "From the compiled form."
    )


@pytest.mark.parametrize("garbage", ["", "{", "[]", '{"format": "other"}'])
def test_an_unusable_compiled_form_falls_back_to_the_yaml(tmp_path: Path, garbage: str) -> None:
    """A compiled form that is empty, not JSON or not ours is ignored: the YAML is read."""
    yaml_copy = _copy_machine(tmp_path)
    machine.compiled_path(yaml_copy).write_text(garbage, encoding="utf-8")
    assert machine.load_spec(yaml_copy).initial == "new"


def test_compiling_refuses_values_json_would_change() -> None:
    """A YAML date (or a non-string key) would come back different from JSON: refused."""
    with pytest.raises(errors.MachineDefinitionError, match="JSON cannot carry unchanged"):
        machine.compile_spec("x: 1", {1: "one"})
