"""Talking to runsc, gVisor's OCI runtime.

``api`` is the contract the lifecycle codes against (:class:`SandboxRuntime`, the typed
errors); ``argv`` builds every command line; ``errors`` maps runsc's messages to the typed
errors; ``driver`` runs the binary. See ``docs/runsc.md``.
"""

from __future__ import annotations

from substrate_gpu.runsc.api import (
    BundleError,
    CheckpointImageError,
    ContainerExistsError,
    ContainerNotFoundError,
    ContainerState,
    ContainerStatus,
    ContainerStoppedError,
    LiveNvproxyClientsError,
    NotRestorableError,
    NvproxyUnavailableError,
    PerSandboxFeatures,
    RunscError,
    RunscFeatures,
    SandboxRuntime,
    StragglerReaper,
    UnsupportedDriverError,
    WrongStateError,
)
from substrate_gpu.runsc.driver import RunscConfig, RunscDriver, Timeouts

__all__ = [
    "BundleError",
    "CheckpointImageError",
    "ContainerExistsError",
    "ContainerNotFoundError",
    "ContainerState",
    "ContainerStatus",
    "ContainerStoppedError",
    "LiveNvproxyClientsError",
    "NotRestorableError",
    "NvproxyUnavailableError",
    "PerSandboxFeatures",
    "RunscConfig",
    "RunscDriver",
    "RunscError",
    "RunscFeatures",
    "SandboxRuntime",
    "StragglerReaper",
    "Timeouts",
    "UnsupportedDriverError",
    "WrongStateError",
]
