"""Benchmark: how fast each everyday ``substrate-gpu`` command answers, against a bare start.

Run: ``.venv/bin/python tests/bench/bench_cli.py [--rounds 21] [--smoke] [--from-source]``.
Not collected by pytest. ``--smoke``: 3 rounds, seconds, no verdicts (exit 0 whatever the
figures).

Each round runs, interleaved so a busy machine slows both alike, a bare interpreter of the
same venv (``python -c pass``) and every command below, each as its own process
(``python -m substrate_gpu …``, what the ``substrate-gpu`` script does). Printed per
command: the median wall time, its ratio to the bare start's median, and the target (within
4x the bare start, median). Outside ``--smoke`` the exit status is 1 when a target is missed.

The package is byte-compiled first (``compileall``), as an installed one is: where
``PYTHONDONTWRITEBYTECODE`` is set (the shared development machine sets it) every command would
otherwise recompile each of its modules from source, ~40 ms of ``inject`` that no installed
``substrate-gpu`` pays. ``--from-source`` measures that case instead (the caches removed).

The commands: ``--help``; ``cdi show`` and ``inject`` of a small spec (a fresh bundle each
round); ``client … actors`` and ``client … actor`` against a running agent; ``replay`` of
that agent's small log; ``pool validate``, ``pool render`` and ``pool crd``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POOLS = REPO / "tests/data/pools/valid"
TARGET_RATIO = 4.0

#: A CDI spec with one GPU (its nodes are /dev/null on the host) and an env entry.
SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "all",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null", "major": 195}]
            },
        }
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "hostPath": "/dev/null", "major": 195, "minor": 255}
        ],
    },
}

CONFIG = {
    "ociVersion": "1.0.2",
    "root": {"path": "rootfs"},
    "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/bin"]},
    "linux": {},
}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "substrate_gpu", *args]


def _wall(argv: list[str], *, before: object = None) -> float:
    """Seconds ``argv`` takes to exit; its failure ends the benchmark (a figure of nothing)."""
    if callable(before):
        before()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, cwd=REPO, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_cli: {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]!r}")
    return elapsed


def _start_agent(tmp: Path) -> subprocess.Popen[bytes]:
    sock = tmp / "agent.sock"
    agent = subprocess.Popen(
        _cli(
            "agent",
            "--socket",
            str(sock),
            "--event-log",
            str(tmp / "events.jsonl"),
            "--checkpoint-root",
            str(tmp / "checkpoints"),
            "--runsc-root",
            str(tmp / "runsc-root"),
            "--runsc",
            str(tmp / "no-runsc-here"),
            "--metrics-port",
            "0",
        ),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(sock))
            except OSError:
                time.sleep(0.05)
                continue
            return agent
    agent.kill()
    sys.exit("bench_cli: the agent did not serve its socket within 60 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--smoke", action="store_true", help="3 rounds, no verdicts")
    parser.add_argument(
        "--from-source", action="store_true", help="no bytecode caches (see the module doc)"
    )
    opts = parser.parse_args()
    rounds = 3 if opts.smoke else opts.rounds
    package = REPO / "substrate_gpu"
    if opts.from_source:
        for cache in package.rglob("__pycache__"):
            shutil.rmtree(cache)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the commands' own, inherited
    else:
        compileall.compile_dir(package, quiet=1)

    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp_name:
        tmp = Path(tmp_name)
        spec = tmp / "nvidia.json"
        spec.write_text(json.dumps(SPEC))
        bundle = tmp / "bundle"
        (bundle / "rootfs").mkdir(parents=True)

        def fresh_bundle() -> None:
            (bundle / "config.json").write_text(json.dumps(CONFIG))

        agent = _start_agent(tmp)
        try:
            sock = str(tmp / "agent.sock")
            lines = "".join(
                json.dumps(
                    {
                        "type": "actor_registered",
                        "v": 1,
                        "actor_id": f"a{i}",
                        "gpu": False,
                        "bundle": "/b",
                    }
                )
                + "\n"
                for i in range(5)
            )
            subprocess.run(
                _cli("client", "--socket", sock, "-"),
                input=lines.encode(),
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            commands: dict[str, tuple[list[str], object]] = {
                "--help": (_cli("--help"), None),
                "cdi show": (_cli("cdi", "show", str(spec)), None),
                "inject": (
                    _cli("inject", "--bundle", str(bundle), "--cdi-spec", str(spec)),
                    fresh_bundle,
                ),
                "client actors": (_cli("client", "--socket", sock, "actors"), None),
                "client actor": (_cli("client", "--socket", sock, "actor", "a1"), None),
                "replay (5 events)": (_cli("replay", str(tmp / "events.jsonl")), None),
                "pool validate": (_cli("pool", "validate", *map(str, POOLS.glob("*.yaml"))), None),
                "pool render": (
                    _cli("pool", "render", "--ateom-image", "w:1", str(POOLS / "cpu-pool.yaml")),
                    None,
                ),
                "pool crd": (_cli("pool", "crd"), None),
            }
            bare = [sys.executable, "-c", "pass"]
            times: dict[str, list[float]] = {"bare interpreter": [], **{n: [] for n in commands}}
            for _ in range(rounds):
                times["bare interpreter"].append(_wall(bare))
                for name, (argv, before) in commands.items():
                    times[name].append(_wall(argv, before=before))
        finally:
            agent.terminate()
            agent.wait(timeout=30)

    base = statistics.median(times["bare interpreter"])
    print(f"substrate-gpu commands, median of {rounds} rounds, interleaved with a bare start")
    print(f"{'command':<22} {'median ms':>10} {'x bare':>8}  target")
    missed = []
    for name, walls in times.items():
        median = statistics.median(walls)
        if name == "bare interpreter":
            print(f"{name:<22} {median * 1e3:>10.1f} {1.0:>8.2f}")
            continue
        ratio = median / base
        verdict = "" if opts.smoke else ("met" if ratio <= TARGET_RATIO else "MISSED")
        if verdict == "MISSED":
            missed.append(name)
        print(f"{name:<22} {median * 1e3:>10.1f} {ratio:>8.2f}  <= {TARGET_RATIO:.0f}x {verdict}")
    if missed:
        print(f"targets missed: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
