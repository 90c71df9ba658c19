"""``substrate-gpu demo``: the README's main command (see :mod:`substrate_gpu.testing.demo`)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="a simulated GPU node: actors through their whole life via the agent "
        "(real runc when root), leaving a replayable event log",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep everything under this directory (default: a temporary one, removed; "
        "the event log is kept next to it)",
    )
    # The transcript is the output: every refusal and failure is a line of it, so the
    # lifecycle's WARNING log lines would say each twice (--log-level WARNING shows them).
    parser.set_defaults(handler=run, default_log_level="ERROR", logs="at start")


def run(args: argparse.Namespace) -> int:
    """Handler of ``demo``: exit 1 if the replayed log disagrees with the live states."""
    # The demo imports the test kit (substrate_gpu.testing): loaded only when the demo runs.
    from substrate_gpu.testing import demo  # noqa: PLC0415

    try:
        result = demo.main(args.workdir, sys.stdout)
    except demo.Terminated:
        return 128 + signal.SIGTERM  # cleaned up as after Ctrl-C (130), told apart
    return EXIT_OK if dict(result.replayed_states) == dict(result.final_states) else EXIT_FAILED
