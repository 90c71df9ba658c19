"""The JSON Schema of the agent's protocol, generated from the types the codec decodes.

``docs/schema/agent-protocol.schema.json`` is this module's output, checked in; a test
fails when it is stale. Regenerate it with::

    .venv/bin/python -m substrate_gpu.service.schema > docs/schema/agent-protocol.schema.json

``$defs`` holds every event type, the queries and the answers (msgspec.json.schema_components of the
same Structs). Three unions on top say who writes what:

- ``Request``: what a client may send, the *external* events, each in its request form:
  ``v`` required, no ``seq`` (the agent stamps it), ``actor_id`` matching the protocol's
  pattern;
- ``Query``: what a client may ask (``{"query": "actor", ...}``, ``{"query": "actors"}``),
  answered and never logged (:mod:`substrate_gpu.service.query`);
- ``Answer``: ``Ack`` or ``Refusal`` for a request, ``ActorAnswer``/``ActorsAnswer`` (or a
  ``Refusal``) for a query, one per line;
- ``Outcome``: the events only the agent's effects produce (they appear in the event log,
  never in a request).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from substrate_gpu.lifecycle import events
from substrate_gpu.service import protocol

_REF = "#/$defs/{name}"


def build() -> dict[str, Any]:
    """The schema document (deterministic: same types, same document)."""
    external = [c for c in events.REGISTRY.values() if c.external]
    outcomes = [c for c in events.REGISTRY.values() if not c.external]
    (_, _), defs = msgspec.json.schema_components(
        [events.union_of(external), events.union_of(outcomes)], ref_template=_REF
    )
    _, answer_defs = msgspec.json.schema_components(
        [protocol.Ack, protocol.Refusal, protocol.ActorAnswer, protocol.ActorsAnswer],
        ref_template=_REF,
    )
    (query_union,), query_defs = msgspec.json.schema_components([protocol.Query], ref_template=_REF)
    answer_defs.update(query_defs)
    defs.update(answer_defs)
    requests = []
    for cls in sorted(external, key=lambda c: c.type):
        name = f"{cls.__name__}Request"
        defs[name] = _request_form(defs[cls.__name__], cls)
        requests.append({"$ref": _REF.format(name=name)})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "substrate-gpu agent protocol",
        "description": (
            "One JSON object per line: a Request in, an Answer out. Generated from "
            "substrate_gpu (python -m substrate_gpu.service.schema); do not edit."
        ),
        "anyOf": [
            {"$ref": "#/$defs/Request"},
            {"$ref": "#/$defs/Query"},
            {"$ref": "#/$defs/Answer"},
        ],
        "$defs": {
            "Request": {
                "description": "What a client may send: an external event, without seq.",
                "oneOf": requests,
                "discriminator": {"propertyName": "type"},
            },
            "Query": {
                "description": "What a client may ask (answered, never logged).",
                **query_union,
            },
            "Answer": {
                "description": "The agent's answer to one request or query line.",
                "oneOf": [
                    {"$ref": _REF.format(name=name)}
                    for name in ("Ack", "Refusal", "ActorAnswer", "ActorsAnswer")
                ],
            },
            "Outcome": {
                "description": "Produced by the agent's effects (event log only), never sent.",
                "oneOf": [
                    {"$ref": _REF.format(name=c.__name__)}
                    for c in sorted(outcomes, key=lambda c: c.type)
                ],
                "discriminator": {"propertyName": "type"},
            },
            **dict(sorted(defs.items())),
        },
    }


def _request_form(event_schema: dict[str, Any], cls: type[events.Event]) -> dict[str, Any]:
    """An event's schema as a request: ``v`` required, ``seq`` absent, actor_id patterned."""
    properties = {k: v for k, v in event_schema["properties"].items() if k != "seq"}
    properties["actor_id"] = {
        **properties["actor_id"],
        "pattern": f"^{protocol.ACTOR_ID.pattern}$",
    }
    required = sorted({*event_schema.get("required", ()), "v"})
    return {
        **event_schema,
        "title": f"{event_schema.get('title', cls.__name__)} (request)",
        "properties": properties,
        "required": required,
    }


def render() -> str:
    """The schema file's text."""
    return json.dumps(build(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
