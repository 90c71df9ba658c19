"""``substrate-gpu controller``: reconcile WorkerPools into worker Deployments."""

from __future__ import annotations

import argparse
import os

from substrate_gpu import _defaults


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``controller``."""
    parser = subparsers.add_parser(
        "controller",
        help="run the WorkerPool controller (pools in, worker Deployments out)",
        description=(
            "Watch WorkerPools and keep one worker Deployment per pool, shaped for its GPUs, "
            "with the pool's status (observedGeneration, replicas, Ready/Rejected). "
            "Credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config. "
            f"Worker shape from the environment: {_defaults.WORKER_IMAGE_ENV}, "
            f"{_defaults.TOOLKIT_HOST_PATH_ENV}, {_defaults.DRIVER_ROOT_ENV}. "
            "See docs/api-guide.md."
        ),
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable; default: the whole cluster)",
    )
    parser.add_argument(
        "--retry-delay",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait before retrying a failed reconcile (default: %(default)s)",
    )
    parser.add_argument(
        "--refusal-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help=(
            "at start, give up (exit 1) once the API server has refused the credentials "
            "(401/403) for this long (default: %(default)s); an unreachable server is waited for"
        ),
    )
    parser.add_argument(
        "--liveness-endpoint",
        metavar="URL",
        help="serve kopf's health check here, e.g. http://0.0.0.0:8080/healthz",
    )
    # A controller's log is its only account of what it did to each pool.
    parser.set_defaults(handler=_run, default_log_level="INFO", logs="at start")


def _run(args: argparse.Namespace) -> int:
    # Imported here: kopf and kubernetes_asyncio are only needed by this command.
    from substrate_gpu.controller import operator  # noqa: PLC0415
    from substrate_gpu.pools import shaping  # noqa: PLC0415

    operator.run_controller(
        shaping.ControllerSettings.from_env(os.environ),
        operator.ControllerOptions(
            namespaces=tuple(args.namespace),
            retry_delay=args.retry_delay,
            liveness_endpoint=args.liveness_endpoint,
            refusal_grace=args.refusal_grace,
        ),
        os.environ,
    )
    return 0
