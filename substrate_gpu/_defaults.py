"""Defaults and environment names the node agent, the controller and the CLI agree on.

The controller renders the worker agent's command line (:mod:`substrate_gpu.pools.worker_agent`)
without loading the agent, and the CLI names these in ``--help`` without loading either: the
values live here, below all of them, and the modules that own the behaviour
(:mod:`~substrate_gpu.observability.http`, :mod:`~substrate_gpu.service.config`,
:mod:`~substrate_gpu.injection.toolkit`, :mod:`~substrate_gpu.pools.shaping`) name theirs
from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

METRICS_HOST: Final = "127.0.0.1"
"""Loopback: a node agent's metrics are scraped locally or through a deliberate choice."""

METRICS_PORT: Final = 9477
"""The agent's metrics port (``--metrics-port``); 0 asks the kernel for a free one."""

DRAIN_TIMEOUT_S: Final = 30.0
"""On SIGTERM/SIGINT, seconds the agent lets running effects finish (``--drain-timeout``)."""

WORKLOAD_GRACE_S: Final = 10.0
"""On SIGTERM, the worker API's one deadline for in-flight lifecycle calls and then for the
app containers to exit after their SIGTERM, before SIGKILL (``--workload-grace``; upstream's
``workloadGracePeriod``). The default suits an agent started by hand; a pool's workers are
started with upstream's 1800 s, which with the 5 s SIGKILL wait and ``--drain-timeout`` fits
the worker pod's 3600 s grace (``pools.worker_agent``)."""

TOOLKIT_DIR: Final = Path("/opt/nvidia-toolkit")
"""Where the NVIDIA Container Toolkit is mounted into the worker (``--toolkit-dir``)."""

DRIVER_ROOT_ENV: Final = "ATE_NVIDIA_DRIVER_ROOT"
"""The NVIDIA driver root's environment variable (agent and controller alike)."""

DRIVER_ROOT: Final = Path("/usr/local/nvidia")
"""The NVIDIA driver root when ``ATE_NVIDIA_DRIVER_ROOT`` is unset."""

TOOLKIT_HOST_PATH_ENV: Final = "ATE_NVIDIA_TOOLKIT_HOST_PATH"
"""Controller setting: the host path of the NVIDIA toolkit mounted into workers."""

WORKER_IMAGE_ENV: Final = "ATE_DEFAULT_WORKER_IMAGE"
"""Controller setting: the worker image for pools without ``spec.workerImage``."""

LEGACY_WORKER_IMAGE_ENV: Final = "ATE_DEFAULT_ATEOM_IMAGE"
"""The former name of ``ATE_DEFAULT_WORKER_IMAGE`` (``spec.ateomImage``'s era), still read."""

MAX_SPEC_BYTES: Final = 16 * 1024 * 1024
"""The largest CDI spec file read (``--max-spec-bytes``); a generated spec is ~30 KiB."""

# Upstream's worker contract (agent-substrate 533900d): what a worker pod reports to atelet,
# and where the WorkerPool controller puts what it needs. The agent's flags default to these
# and pool rendering writes them, so the two cannot drift.

MAX_ACTORS: Final = 1000
"""Actors one worker hosts at once (``--max-actors``; upstream's worker's default)."""

WORKER_SUPPORT_SOCKET: Final = Path("/var/lib/ate/worker-support.sock")
RUNSC_STATIC_DIR: Final = Path("/var/lib/ate/static-files")
"""Where atelet stages runtime binaries (upstream's ``nodepath.StaticFilesDir``): a request's
``runsc_path`` must be a regular executable file under it (``--runsc-static-dir``)."""
"""atelet's node-local socket for its workers (upstream's ``nodepath.WorkerSupportSocket``)."""

IMAGE_LAYERS_DIR: Final = Path("/var/lib/ate")
"""Where atelet's image cache keeps the layers a bundle's rootfs-overlay.json names (upstream's
``nodepath.BasePath``, the host directory atelet and the workers both mount)."""

CAPACITY_DIR: Final = Path("/run/worker-capacity")
"""The worker container's own limits, projected by the downward API (``--capacity-dir``)."""

CPU_LIMIT_FILE: Final = "cpu_milli"
"""In :data:`CAPACITY_DIR`: the container's CPU limit in millicores."""

MEMORY_LIMIT_FILE: Final = "memory_bytes"
"""In :data:`CAPACITY_DIR`: the container's memory limit in bytes."""

POD_IDENTITY_DIR: Final = Path("/run/podidentity.podcert.ate.dev")
"""Where the worker's Pod certificate and its signer's trust bundle are projected."""

CREDENTIAL_BUNDLE: Final = POD_IDENTITY_DIR / "credential-bundle.pem"
"""The worker's Pod credential bundle (``--atunnel-credential-bundle``)."""

TRUST_BUNDLE: Final = POD_IDENTITY_DIR / "trust-bundle.pem"
"""The Pod identity signer's trust bundle (``--atunnel-trust-bundle``)."""

ATELET_SPIFFE_ID: Final = "spiffe://cluster.local/ns/ate-system/sa/atelet"
"""The identity atelet presents in the canonical install (``--atunnel-broker-identity``)."""
