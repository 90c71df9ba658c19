"""substrate-gpu: NVIDIA GPUs for gVisor-sandboxed AI actors.

The front door: what an embedder needs, re-exported by name (listed, with a line each, in
docs/python-api.md; a test keeps the two equal). Everything else is reached through its
subpackage as a module (``from substrate_gpu import cdi``, ``from substrate_gpu.lifecycle
import events``). The test kit is :mod:`substrate_gpu.testing`, never imported from here.

The names resolve lazily (PEP 562): ``import substrate_gpu`` alone loads nothing but this
module and the error hierarchy. Every import of a subpackage runs this module first, the
CLI's included, and each ``substrate-gpu`` command must load only what it needs
(tests/bench/bench_cli.py): resolving every name here would cost many times a bare
interpreter's start, where the lazy door adds little to it (tests/bench/README.md, "Figures
behind design choices"). The runsc stand-in no longer imports the package at all (it runs as
a script).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from substrate_gpu.exceptions import (
    CdiSpecError,
    ConfigError,
    DeviceRequestError,
    DeviceResolutionError,
    ExternalCommandError,
    InjectionError,
    RootfsEscapeError,
    SubstrateGpuError,
    ToolkitError,
)

if TYPE_CHECKING:
    from substrate_gpu.cdi import ContainerEdits, edits_for_all
    from substrate_gpu.cdi import Spec as CdiSpec
    from substrate_gpu.cdi import load_spec as load_cdi_spec
    from substrate_gpu.cdi import parse_spec as parse_cdi_spec
    from substrate_gpu.eventlog import (
        CorruptLogError,
        EventLog,
        EventLogError,
        Recovery,
        ReplayResult,
        read_log,
        recover,
        replay,
    )
    from substrate_gpu.injection.bundle import InjectionOptions, InjectionReport, inject_gpu
    from substrate_gpu.injection.injector import WorkerGpuInjector
    from substrate_gpu.injection.toolkit import CdiSpecGenerator, ToolkitConfig
    from substrate_gpu.lifecycle import (
        ActorView,
        Agent,
        AgentClosedError,
        EventSchemaError,
        InvalidEvent,
        MachineSpec,
        Transition,
        events,
    )
    from substrate_gpu.lifecycle import load_spec as load_machine_spec
    from substrate_gpu.observability import configure_logging
    from substrate_gpu.observability.http import MetricsServer
    from substrate_gpu.observability.metrics import AgentMetrics
    from substrate_gpu.probes import FdScanProbe
    from substrate_gpu.runsc import RunscConfig, RunscDriver, RunscError

#: Public name -> (module, attribute in it).
_LAZY: dict[str, tuple[str, str]] = {
    # The lifecycle: the embedding API, its events, the machine as data.
    "Agent": ("substrate_gpu.lifecycle", "Agent"),
    "ActorView": ("substrate_gpu.lifecycle", "ActorView"),
    "Transition": ("substrate_gpu.lifecycle", "Transition"),
    "MachineSpec": ("substrate_gpu.lifecycle", "MachineSpec"),
    "load_machine_spec": ("substrate_gpu.lifecycle", "load_spec"),
    "events": ("substrate_gpu.lifecycle", "events"),
    # The production collaborators an Agent runs on.
    "RunscDriver": ("substrate_gpu.runsc", "RunscDriver"),
    "RunscConfig": ("substrate_gpu.runsc", "RunscConfig"),
    "FdScanProbe": ("substrate_gpu.probes", "FdScanProbe"),
    # CDI spec parsing.
    "CdiSpec": ("substrate_gpu.cdi", "Spec"),
    "ContainerEdits": ("substrate_gpu.cdi", "ContainerEdits"),
    "parse_cdi_spec": ("substrate_gpu.cdi", "parse_spec"),
    "load_cdi_spec": ("substrate_gpu.cdi", "load_spec"),
    "edits_for_all": ("substrate_gpu.cdi", "edits_for_all"),
    # GPU injection.
    "WorkerGpuInjector": ("substrate_gpu.injection.injector", "WorkerGpuInjector"),
    "CdiSpecGenerator": ("substrate_gpu.injection.toolkit", "CdiSpecGenerator"),
    "ToolkitConfig": ("substrate_gpu.injection.toolkit", "ToolkitConfig"),
    "inject_gpu": ("substrate_gpu.injection.bundle", "inject_gpu"),
    "InjectionOptions": ("substrate_gpu.injection.bundle", "InjectionOptions"),
    "InjectionReport": ("substrate_gpu.injection.bundle", "InjectionReport"),
    # The event log: writing, reading, replay, recovery.
    "EventLog": ("substrate_gpu.eventlog", "EventLog"),
    "read_log": ("substrate_gpu.eventlog", "read_log"),
    "replay": ("substrate_gpu.eventlog", "replay"),
    "ReplayResult": ("substrate_gpu.eventlog", "ReplayResult"),
    "recover": ("substrate_gpu.eventlog", "recover"),
    "Recovery": ("substrate_gpu.eventlog", "Recovery"),
    # Metrics and logs.
    "AgentMetrics": ("substrate_gpu.observability.metrics", "AgentMetrics"),
    "MetricsServer": ("substrate_gpu.observability.http", "MetricsServer"),
    "configure_logging": ("substrate_gpu.observability", "configure_logging"),
    # Errors raised below the package root (the base classes are imported above).
    "InvalidEvent": ("substrate_gpu.lifecycle", "InvalidEvent"),
    "AgentClosedError": ("substrate_gpu.lifecycle", "AgentClosedError"),
    "EventSchemaError": ("substrate_gpu.lifecycle", "EventSchemaError"),
    "EventLogError": ("substrate_gpu.eventlog", "EventLogError"),
    "CorruptLogError": ("substrate_gpu.eventlog", "CorruptLogError"),
    "RunscError": ("substrate_gpu.runsc", "RunscError"),
}

__all__ = [
    "ActorView",
    "Agent",
    "AgentClosedError",
    "AgentMetrics",
    "CdiSpec",
    "CdiSpecError",
    "CdiSpecGenerator",
    "ConfigError",
    "ContainerEdits",
    "CorruptLogError",
    "DeviceRequestError",
    "DeviceResolutionError",
    "EventLog",
    "EventLogError",
    "EventSchemaError",
    "ExternalCommandError",
    "FdScanProbe",
    "InjectionError",
    "InjectionOptions",
    "InjectionReport",
    "InvalidEvent",
    "MachineSpec",
    "MetricsServer",
    "Recovery",
    "ReplayResult",
    "RootfsEscapeError",
    "RunscConfig",
    "RunscDriver",
    "RunscError",
    "SubstrateGpuError",
    "ToolkitConfig",
    "ToolkitError",
    "Transition",
    "WorkerGpuInjector",
    "configure_logging",
    "edits_for_all",
    "events",
    "inject_gpu",
    "load_cdi_spec",
    "load_machine_spec",
    "parse_cdi_spec",
    "read_log",
    "recover",
    "replay",
]


def __getattr__(name: str) -> object:
    """Resolve a public name on first use (see the module docstring), then keep it."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'substrate_gpu' has no attribute {name!r}") from None
    value: object = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
