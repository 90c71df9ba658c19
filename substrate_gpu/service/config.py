"""What one agent process is configured with (``substrate-gpu agent`` flags, as a value)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu import _defaults
from substrate_gpu.injection import toolkit
from substrate_gpu.observability.http import DEFAULT_HOST

DEFAULT_RUNSC_ROOT: Final = Path("/var/run/runsc")
DEFAULT_CHECKPOINT_ROOT: Final = Path("/var/lib/substrate-gpu/checkpoints")
DEFAULT_CDI_OUTPUT_DIR: Final = Path("/var/run/cdi")
DEFAULT_DRAIN_TIMEOUT: Final = _defaults.DRAIN_TIMEOUT_S
DEFAULT_MAX_CLIENTS: Final = 256
DEFAULT_MAX_WORKER_CLIENTS: Final = 64
"""atelet holds one connection to its worker (one gRPC channel): 64 is room for tools and
reconnects, and keeps a flood of connections far below a 1024-descriptor limit."""
MAX_WORKER_CLIENTS_LIMIT: Final = 2**31 - 2
"""gRPC core takes the bound as a C int below INT_MAX."""
DEFAULT_IDLE_TIMEOUT: Final = 300.0
DEFAULT_LINE_TIMEOUT: Final = 10.0
DEFAULT_LIVENESS_TIMEOUT: Final = 10.0
DEFAULT_MAX_ACTORS: Final = _defaults.MAX_ACTORS
DEFAULT_ATELET_SOCKET: Final = _defaults.WORKER_SUPPORT_SOCKET
DEFAULT_IMAGE_LAYERS_DIR: Final = _defaults.IMAGE_LAYERS_DIR
DEFAULT_RUNSC_STATIC_DIR: Final = _defaults.RUNSC_STATIC_DIR
MAX_ACTORS_LIMIT: Final = 2**31 - 1
"""The report carries ``--max-actors`` as an int32."""


@dataclass(frozen=True)
class AgentConfig:
    """Everything the standalone agent needs to wire itself."""

    event_log: Path | None = None
    """The event log (created when absent, recovered and resumed when present)."""
    socket: Path | None = None
    """The Unix socket requests arrive on (mode 0600)."""
    worker_socket: Path | None = None
    """The Unix socket agent-substrate's worker API (``ateworker.Worker``, gRPC) is served on
    (mode 0600; docs/worker-api.md)."""
    stdin: bool = False
    """Also read requests from stdin (acknowledgements on stdout)."""
    metrics_host: str = DEFAULT_HOST
    """Where the metrics endpoint listens."""
    metrics_port: int = 0
    """The metrics port; 0 turns the endpoint off."""
    runsc: str = "runsc"
    """The runsc executable."""
    runsc_root: Path = DEFAULT_RUNSC_ROOT
    """runsc's ``--root`` state directory."""
    runsc_flags: tuple[str, ...] = ()
    """Extra global runsc flags on every command (``--platform=systrap``, ``--network=none``)."""
    sandbox_network: str | None = None
    """``pod``: every sandbox on the agent's (the worker pod's) network namespace (runsc
    ``--network=host``, no network namespace in the bundles); ``none``: no network (runsc
    ``--network=none``); None: as ``runsc_flags`` and the bundles say."""
    driver_root: Path = toolkit.DEFAULT_DRIVER_ROOT
    """The NVIDIA driver root (``ATE_NVIDIA_DRIVER_ROOT``)."""
    toolkit_dir: Path = toolkit.DEFAULT_TOOLKIT_DIR
    """The mounted NVIDIA toolkit (nvidia-ctk, nvidia-cdi-hook)."""
    cdi_output_dir: Path = DEFAULT_CDI_OUTPUT_DIR
    """Where the worker's CDI spec is generated."""
    dev_root: Path = Path("/")
    """Host-root prefix for stat-ing device nodes."""
    checkpoint_root: Path = DEFAULT_CHECKPOINT_ROOT
    """Checkpoint images go to ``<checkpoint_root>/<actor>/<seq>``."""
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    """On SIGTERM/SIGINT: seconds to let running effects finish before closing."""
    max_clients: int = DEFAULT_MAX_CLIENTS
    """Socket clients served at once; one more is answered ``busy`` and disconnected."""
    max_worker_clients: int = DEFAULT_MAX_WORKER_CLIENTS
    """Worker socket connections held at once; one more is closed as it is accepted."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds a socket client may stay connected without sending a byte."""
    line_timeout: float = DEFAULT_LINE_TIMEOUT
    """Seconds a socket client has to finish a line it started (and to read an answer)."""
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    """Seconds without an event-loop heartbeat before ``/healthz`` fails."""
    extra_env: tuple[tuple[str, str], ...] = ()
    """Environment added to nvidia-ctk's (a proxy, a toolkit setting, a stand-in's knobs)."""
    driver_preflight: bool = True
    """Refuse, before any sandbox exists, a driver ``runsc nvproxy list-supported-drivers``
    does not list, and restores onto another driver or fewer GPUs."""
    cuda_checkpoint: Path | None = None
    """The host's ``cuda-checkpoint``: enables runsc's ``--cuda-checkpoint-path`` route."""
    sandbox_cuda_checkpoint: str | None = None
    """``cuda-checkpoint`` as sandboxes see it: enables the exec route (``runsc exec``)."""
    workload_grace: float = _defaults.WORKLOAD_GRACE_S
    """On SIGTERM, the worker API's deadline for in-flight lifecycle calls and then for app
    containers to exit after SIGTERM, before SIGKILL (``--workload-grace``)."""
    max_actors: int = DEFAULT_MAX_ACTORS
    """Actors the worker API hosts at once (a Run or Restore beyond is RESOURCE_EXHAUSTED),
    and the ``actors`` of the capacity report (``--max-actors``)."""
    runsc_static_dir: Path = DEFAULT_RUNSC_STATIC_DIR
    """Where atelet stages runsc: a request's ``runsc_path`` must be a regular executable
    file under it, and its sandbox then runs that binary (``--runsc-static-dir``)."""
    atelet_socket: Path | None = None
    """atelet's worker-support socket the capacity report goes to when the worker API is
    served (``--atelet-socket``, default upstream's); None: no report."""
    credential_bundle: Path = _defaults.CREDENTIAL_BUNDLE
    """The worker's Pod credential bundle, presented to atelet (``--atunnel-credential-bundle``)."""
    trust_bundle: Path = _defaults.TRUST_BUNDLE
    """The CA bundle atelet's certificate must chain to (``--atunnel-trust-bundle``)."""
    atelet_spiffe_id: str = _defaults.ATELET_SPIFFE_ID
    """The SPIFFE ID atelet must present (``--atunnel-broker-identity``)."""
    image_layers_dir: Path = _defaults.IMAGE_LAYERS_DIR
    """Where the cached image layers a bundle's ``rootfs-overlay.json`` names must lie
    (``--image-layers-dir``; upstream's node base path)."""
    capacity_dir: Path = _defaults.CAPACITY_DIR
    """The downward-API files of the container's CPU and memory limits (``--capacity-dir``)."""
