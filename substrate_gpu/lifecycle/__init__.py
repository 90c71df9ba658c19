"""The per-actor lifecycle: the machine (``machines/actor.yaml``), events, the pipeline, the agent.

Where things live: :mod:`.machine` loads and validates the YAML and renders its diagram;
:mod:`.events` defines the event values; :mod:`.actors` holds actor records and applies an
event to one; :mod:`.effects` talks to runsc, the CUDA probe and the GPU injector;
:mod:`.pipeline` orders events and runs effects; :mod:`.agent` is the embedding API;
:mod:`.hooks` the seams for the event log, observers and metrics.

The agent and its effects (anyio, runsc, the injector) resolve on first use (PEP 562): replaying
a log or decoding an event (``substrate-gpu replay``, ``client``) loads neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrate_gpu import _lazy
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.lifecycle.errors import (
    AgentClosedError,
    EventSchemaError,
    InvalidEvent,
    MachineDefinitionError,
    StateUnreachable,
    StateWaitTimeout,
    SubscriptionOverflow,
)
from substrate_gpu.lifecycle.events import Event, from_dict, from_json
from substrate_gpu.lifecycle.hooks import (
    EventRecorder,
    LifecycleMetrics,
    Transition,
    TransitionObserver,
)
from substrate_gpu.lifecycle.machine import MachineSpec, load_spec, render_mermaid

if TYPE_CHECKING:
    from substrate_gpu.lifecycle.agent import Agent, Subscription
    from substrate_gpu.lifecycle.effects import GpuInjector

#: The names resolved on first use, and the module that defines each.
_LAZY = {
    "Agent": "substrate_gpu.lifecycle.agent",
    "Subscription": "substrate_gpu.lifecycle.agent",
    "GpuInjector": "substrate_gpu.lifecycle.effects",
}

__all__ = [
    "ActorView",
    "Agent",
    "AgentClosedError",
    "Event",
    "EventRecorder",
    "EventSchemaError",
    "GpuInjector",
    "InvalidEvent",
    "LifecycleMetrics",
    "MachineDefinitionError",
    "MachineSpec",
    "StateUnreachable",
    "StateWaitTimeout",
    "Subscription",
    "SubscriptionOverflow",
    "Transition",
    "TransitionObserver",
    "from_dict",
    "from_json",
    "load_spec",
    "render_mermaid",
]


#: Resolves a name of :data:`_LAZY` on first use, then keeps it.
__getattr__ = _lazy.module_getattr(__name__, _LAZY, globals())
