"""Soak: ``substrate-gpu agent`` under honest and hostile clients with SIGKILL/restart cycles.

Run: ``.venv/bin/python tests/bench/soak_agent.py [--duration 300] [--clients 32] [--smoke]``.
Not collected by pytest (``tests/service/test_soak.py`` runs a bounded soak in the suite).
What the clients send and what is checked: ``tests/service/soak.py``. Prints clients x
events, restarts, acknowledged, lost (must be 0), duplicated (must be 0), and the agent's
peak RSS beside its RSS after the first start; exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for service.*

from service.soak import run_soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--clients", type=int, default=32, help="client threads (default 32)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny: 5 s, 4 clients, one or two restarts (seconds)"
    )
    parser.add_argument("--base", type=Path, default=None, help="where the agent's files go")
    args = parser.parse_args()
    duration, clients, kill_every = args.duration, args.clients, (3.0, 10.0)
    if args.smoke:
        duration, clients, kill_every = 5.0, 4, (2.0, 3.0)
    with tempfile.TemporaryDirectory(prefix="soak-agent-", dir=args.base) as tmp:
        report = run_soak(
            Path(tmp), duration=duration, clients=clients, seed=args.seed, kill_every=kill_every
        )
    for line in report.lines():
        print(line)
    for problem in (report.replay_mismatches + report.wrong_answers)[:20]:
        print(f"  problem: {problem}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
