"""``substrate-gpu agent``: the standalone node agent process (see ``docs/agent.md``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from substrate_gpu import _defaults, exceptions
from substrate_gpu.cli import _deferred, _types

if TYPE_CHECKING:
    from substrate_gpu.service import config as config_

#: ``--sandbox-network``'s choices (docs/worker-api.md, "The actor's network").
SANDBOX_NETWORKS = ("pod", "none")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``agent`` (its arguments when it is typed: their defaults load the agent stack)."""
    parser = subparsers.add_parser(
        "agent",
        help="run the node agent: events in (Unix socket, stdin), event log, metrics",
        description=(
            "Read lifecycle events as JSON lines from a Unix socket and/or stdin, answer each "
            "with an acknowledgement or an error, keep the event log (resuming from it on "
            "start), and serve Prometheus metrics. See docs/agent.md."
        ),
    )
    parser.set_defaults(
        handler=run, default_log_level="INFO", logs="at start", usage_error=parser.error
    )
    _deferred.defer_arguments(parser, _add_arguments)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    # The agent stack is loaded here; `substrate-gpu agent` runs it anyway.
    from substrate_gpu.injection import toolkit  # noqa: PLC0415
    from substrate_gpu.observability.http import DEFAULT_HOST, DEFAULT_PORT  # noqa: PLC0415
    from substrate_gpu.service import config as config_  # noqa: PLC0415

    io = parser.add_argument_group("requests and state")
    io.add_argument(
        "--socket",
        type=Path,
        help="Unix socket to serve (created mode 0600; its directory 0700 when absent)",
    )
    io.add_argument(
        "--worker-socket",
        type=Path,
        help="also serve agent-substrate's worker API (gRPC ateworker.Worker) on this Unix "
        "socket; atelet expects /var/lib/ate/workers/<pod uid>/worker.sock (docs/worker-api.md)",
    )
    io.add_argument(
        "--stdin",
        action="store_true",
        help="also read requests from stdin, answers on stdout (alone: exit at EOF)",
    )
    io.add_argument(
        "--event-log",
        type=Path,
        help="the event log (created if absent; recovered and resumed if present)",
    )
    _defaulted(
        io,
        "--checkpoint-root",
        Path,
        config_.DEFAULT_CHECKPOINT_ROOT,
        "checkpoint images go to DIR/<actor>/<seq>",
    )
    _defaulted(
        io,
        "--drain-timeout",
        float,
        config_.DEFAULT_DRAIN_TIMEOUT,
        "on SIGTERM/SIGINT, seconds to let running effects finish",
    )
    worker = parser.add_argument_group(
        "the worker API and atelet (with --worker-socket; docs/worker-api.md)"
    )
    _defaulted(
        worker,
        "--max-actors",
        int,
        config_.DEFAULT_MAX_ACTORS,
        "actors hosted at once: one Run or Restore more is answered RESOURCE_EXHAUSTED; "
        "reported to atelet as the worker's capacity",
    )
    _defaulted(
        worker,
        "--image-layers-dir",
        Path,
        config_.DEFAULT_IMAGE_LAYERS_DIR,
        "where the cached image layers atelet's rootfs-overlay.json names must lie; a bundle "
        "naming a layer elsewhere is refused",
    )
    _defaulted(
        worker,
        "--workload-grace",
        float,
        _defaults.WORKLOAD_GRACE_S,
        "on SIGTERM, seconds for in-flight worker calls (checkpoints finish) and then for "
        "every app container to exit after its SIGTERM, before SIGKILL",
    )
    _defaulted(
        worker,
        "--max-worker-clients",
        int,
        config_.DEFAULT_MAX_WORKER_CLIENTS,
        "worker socket connections held at once; one more is closed as it is accepted, "
        "with a warning while the socket is full",
    )
    _defaulted(
        worker,
        "--runsc-static-dir",
        Path,
        config_.DEFAULT_RUNSC_STATIC_DIR,
        "where atelet stages runsc: a request's runsc_path must be a regular executable "
        "file under it, and its sandbox runs that binary",
    )
    worker.add_argument(
        "--atelet-socket",
        type=str,
        default=str(config_.DEFAULT_ATELET_SOCKET),
        help="atelet's worker-support socket the capacity report goes to, over mTLS; an "
        "empty value turns the report off (default: %(default)s)",
    )
    _defaulted(
        worker,
        "--atunnel-credential-bundle",
        Path,
        _defaults.CREDENTIAL_BUNDLE,
        "the worker's Pod credential bundle (PEM: its private key, then its certificate "
        "chain), presented to atelet",
    )
    _defaulted(
        worker,
        "--atunnel-trust-bundle",
        Path,
        _defaults.TRUST_BUNDLE,
        "the Pod identity signer's trust bundle (PEM) atelet's certificate must chain to",
    )
    _defaulted(
        worker,
        "--atunnel-broker-identity",
        str,
        _defaults.ATELET_SPIFFE_ID,
        "the SPIFFE ID atelet must present (override when atelet runs outside the default "
        "namespace)",
    )
    _defaulted(
        worker,
        "--capacity-dir",
        Path,
        _defaults.CAPACITY_DIR,
        f"the downward-API files {_defaults.CPU_LIMIT_FILE} and {_defaults.MEMORY_LIMIT_FILE}: "
        "the container's CPU (millicores) and memory (bytes) limits, reported to atelet",
    )
    limits = parser.add_argument_group("client limits (socket)")
    _defaulted(
        limits,
        "--max-clients",
        int,
        config_.DEFAULT_MAX_CLIENTS,
        "clients served at once; one more is answered 'busy'",
    )
    _defaulted(
        limits,
        "--idle-timeout",
        float,
        config_.DEFAULT_IDLE_TIMEOUT,
        "seconds a client may stay connected sending nothing",
    )
    _defaulted(
        limits,
        "--line-timeout",
        float,
        config_.DEFAULT_LINE_TIMEOUT,
        "seconds a client has to finish a line it started, and to take an answer",
    )
    metrics = parser.add_argument_group("metrics")
    _defaulted(metrics, "--metrics-host", str, DEFAULT_HOST, "metrics address")
    _defaulted(
        metrics,
        "--metrics-port",
        int,
        DEFAULT_PORT,
        "metrics port, also serving /healthz and /readyz; 0 turns the endpoint off",
    )
    _defaulted(
        metrics,
        "--liveness-timeout",
        float,
        config_.DEFAULT_LIVENESS_TIMEOUT,
        "seconds without an event-loop heartbeat before /healthz fails",
    )
    runtime = parser.add_argument_group("runtime and GPU injection")
    _defaulted(runtime, "--runsc", str, "runsc", "the runsc binary")
    _defaulted(runtime, "--runsc-root", Path, config_.DEFAULT_RUNSC_ROOT, "runsc --root")
    runtime.add_argument(
        "--runsc-flag",
        dest="runsc_flags",
        action="append",
        default=[],
        metavar="FLAG",
        help="a global runsc flag for every command, e.g. --runsc-flag=--platform=systrap "
        "(repeatable; see docs/runsc.md)",
    )
    runtime.add_argument(
        "--sandbox-network",
        choices=SANDBOX_NETWORKS,
        default=None,
        help="pod: sandboxes on the worker pod's network namespace (runsc --network=host); "
        "none: no network (runsc --network=none); default: as --runsc-flag and the bundles say",
    )
    runtime.add_argument(
        "--driver-root",
        type=Path,
        default=Path(os.environ.get(toolkit.ENV_DRIVER_ROOT) or toolkit.DEFAULT_DRIVER_ROOT),
        help=f"NVIDIA driver root (default: ${toolkit.ENV_DRIVER_ROOT} or "
        f"{toolkit.DEFAULT_DRIVER_ROOT})",
    )
    _defaulted(
        runtime,
        "--toolkit-dir",
        _types.absolute_path,
        toolkit.DEFAULT_TOOLKIT_DIR,
        "the mounted NVIDIA toolkit",
    )
    _defaulted(
        runtime,
        "--cdi-output-dir",
        Path,
        config_.DEFAULT_CDI_OUTPUT_DIR,
        "where the worker's CDI spec is generated",
    )
    _defaulted(runtime, "--dev-root", Path, Path("/"), "host-root prefix for stat-ing device nodes")
    suspend = parser.add_argument_group("driver preflight and GPU-aware suspend")
    suspend.add_argument(
        "--no-driver-preflight",
        dest="driver_preflight",
        action="store_false",
        help="do not check the host driver against runsc's supported list before create/restore",
    )
    suspend.add_argument(
        "--cuda-checkpoint",
        type=Path,
        help="the host's cuda-checkpoint: enables runsc's --cuda-checkpoint-path route",
    )
    suspend.add_argument(
        "--sandbox-cuda-checkpoint",
        help="cuda-checkpoint as sandboxes see it: enables the exec route (runsc exec)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="run on a simulated GPU node in a temporary directory with a scripted workload "
        "looping forever (the runtime/injection flags are ignored)",
    )


def _defaulted(
    group: argparse._ArgumentGroup,
    flag: str,
    kind: Callable[[str], object],
    default: object,
    help: str,
) -> None:
    """A flag with a value and a default, the default named in its help."""
    group.add_argument(flag, type=kind, default=default, help=f"{help} (default: %(default)s)")


def config_from(args: argparse.Namespace) -> config_.AgentConfig:
    """The agent configuration the flags describe."""
    from substrate_gpu.service import config as config_  # noqa: PLC0415

    if not 0 <= args.metrics_port <= 65535:
        raise exceptions.ConfigError(
            f"while reading --metrics-port: {args.metrics_port} is not a port (0-65535)"
        )
    if args.max_clients < 1:
        raise exceptions.ConfigError(
            f"while reading --max-clients: {args.max_clients} must be at least 1"
        )
    if not 1 <= args.max_worker_clients <= config_.MAX_WORKER_CLIENTS_LIMIT:
        raise exceptions.ConfigError(
            f"while reading --max-worker-clients: {args.max_worker_clients} must be between 1 "
            f"and {config_.MAX_WORKER_CLIENTS_LIMIT}"
        )
    for flag, seconds in (
        ("--idle-timeout", args.idle_timeout),
        ("--line-timeout", args.line_timeout),
        ("--liveness-timeout", args.liveness_timeout),
    ):
        if not seconds > 0 or seconds == float("inf"):
            raise exceptions.ConfigError(
                f"while reading {flag}: {seconds} must be a positive number of seconds"
            )
    if not 0 <= args.max_actors <= config_.MAX_ACTORS_LIMIT:
        raise exceptions.ConfigError(
            f"while reading --max-actors: {args.max_actors} must be between 0 and "
            f"{config_.MAX_ACTORS_LIMIT}"
        )
    for flag in args.runsc_flags:
        # A positional here would become runsc's subcommand (Go's flag stops at it).
        if not flag.startswith("-"):
            raise exceptions.ConfigError(
                f"while reading --runsc-flag: {flag!r} is not a flag "
                "(write --runsc-flag=--name=value)"
            )
        if args.sandbox_network is not None and flag.lstrip("-").startswith("network"):
            raise exceptions.ConfigError(
                f"while reading --runsc-flag: {flag!r} contradicts --sandbox-network "
                f"{args.sandbox_network}; give one of them"
            )
    return config_.AgentConfig(
        event_log=args.event_log,
        socket=args.socket,
        worker_socket=args.worker_socket,
        stdin=args.stdin,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        runsc=args.runsc,
        runsc_root=args.runsc_root,
        runsc_flags=tuple(args.runsc_flags),
        sandbox_network=args.sandbox_network,
        driver_root=args.driver_root,
        toolkit_dir=args.toolkit_dir,
        cdi_output_dir=args.cdi_output_dir,
        dev_root=args.dev_root,
        checkpoint_root=args.checkpoint_root,
        drain_timeout=args.drain_timeout,
        workload_grace=args.workload_grace,
        max_clients=args.max_clients,
        max_worker_clients=args.max_worker_clients,
        idle_timeout=args.idle_timeout,
        line_timeout=args.line_timeout,
        liveness_timeout=args.liveness_timeout,
        driver_preflight=args.driver_preflight,
        cuda_checkpoint=args.cuda_checkpoint,
        sandbox_cuda_checkpoint=args.sandbox_cuda_checkpoint,
        max_actors=args.max_actors,
        runsc_static_dir=args.runsc_static_dir,
        atelet_socket=Path(args.atelet_socket) if args.atelet_socket else None,
        credential_bundle=args.atunnel_credential_bundle,
        trust_bundle=args.atunnel_trust_bundle,
        atelet_spiffe_id=args.atunnel_broker_identity,
        capacity_dir=args.capacity_dir,
        image_layers_dir=args.image_layers_dir,
    )


def run(args: argparse.Namespace) -> int:
    """Handler of ``agent``."""
    import anyio  # noqa: PLC0415

    from substrate_gpu.service import server  # noqa: PLC0415

    config = config_from(args)
    if args.demo:
        return _run_demo(config)
    if config.socket is None and config.worker_socket is None and not config.stdin:
        # A command-line mistake (exit 2, with the agent's usage), not a failure.
        args.usage_error(
            "no input: give --socket PATH, --worker-socket PATH and/or --stdin (or --demo)"
        )
    return anyio.run(functools.partial(server.run, config))


def _run_demo(config: config_.AgentConfig) -> int:
    import tempfile  # noqa: PLC0415  (demo mode only: it would slow every command's start)

    import anyio  # noqa: PLC0415

    from substrate_gpu.testing import demo  # noqa: PLC0415  (imports the test kit: demo mode only)

    with tempfile.TemporaryDirectory(prefix="substrate-gpu-agent-demo-") as tmp:
        workdir = Path(tmp)
        node = demo.build_demo_node(
            workdir, metrics_host=config.metrics_host, metrics_port=config.metrics_port
        )
        demo_config = dataclasses.replace(
            node.config,
            socket=config.socket,
            stdin=config.stdin,
            event_log=config.event_log or node.config.event_log,
        )
        print(
            f"substrate-gpu agent --demo: simulated node in {workdir}; "
            f"runtime: {node.runtime_detail}",
            file=sys.stderr,
        )

        try:
            return anyio.run(demo.serve_with_workload, demo_config, node, workdir / "bundles")
        finally:
            demo.cleanup_containers(workdir)
