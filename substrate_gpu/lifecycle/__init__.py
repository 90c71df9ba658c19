"""The per-actor lifecycle: the machine (``machines/actor.yaml``), events, the pipeline, the agent.

Where things live: :mod:`.machine` loads and validates the YAML and renders its diagram;
:mod:`.events` defines the event values; :mod:`.actors` holds actor records and applies an
event to one; :mod:`.effects` talks to runsc, the CUDA probe and the GPU injector;
:mod:`.pipeline` orders events and runs effects; :mod:`.agent` is the embedding API;
:mod:`.hooks` the seams for the event log, observers and metrics.
"""

from __future__ import annotations

from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.lifecycle.agent import Agent, Subscription
from substrate_gpu.lifecycle.effects import GpuInjector
from substrate_gpu.lifecycle.errors import (
    AgentClosedError,
    EventSchemaError,
    InvalidEvent,
    MachineDefinitionError,
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
