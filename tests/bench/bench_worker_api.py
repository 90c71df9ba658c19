"""Worker API benchmark: a ``_pause`` + one app CPU sandbox on real gVisor, through
``substrate-gpu agent --worker-socket`` (gRPC, our stubs) vs the same runsc commands issued
directly, and vs upstream's own gVisor worker when given, side by side in one run.

    .venv/bin/python tests/bench/bench_worker_api.py [--rounds 10] [--load N]
        [--upstream-worker PATH [--upstream-source DIR]] [--smoke]
    .venv/bin/python tests/bench/bench_worker_api.py --scale 1000 [--load N] [--profile]
    .venv/bin/python tests/bench/bench_worker_api.py --hops [--rounds 3]

Needs the runsc scripts/build-runsc.sh builds (``--platform=systrap --network=none``, as the
tests run it) and root. Per call, the median over the rounds and its interquartile range:

- **run→running**: ``RunWorkload`` until it answers (the agent's sandbox is running) vs
  ``create _pause``, ``start _pause``, ``create app``, ``start app``;
- **checkpoint**: ``CheckpointWorkload`` (FULL: the checkpoint, then the workload torn down)
  vs ``checkpoint --image-path C _pause`` and ``delete --force`` app, ``_pause``, app again
  (the agent's delete order: the app's record outlives the exited sandbox);
- **restore**: ``RestoreWorkload`` (FULL) vs ``create _pause``, ``restore --detach _pause``,
  then the same for ``app``, from the same image.

Each round ends with the sandbox deleted (``TerminateWorkload``; ``delete --force`` app then
``_pause``), outside the timings. Target: the gRPC door adds ≤ 10 % and ≤ 25 ms per worker;
a negative "added" is flagged as a measurement problem (the door cannot cost less than
nothing). Upstream reports, for a CPU actor, restore 196–294 ms and checkpoint 212–243 ms.

**Upstream's worker** (``--upstream-worker PATH`` or ``$SUBSTRATE_GPU_UPSTREAM_WORKER``:
agent-substrate's ``ateom-gvisor``, built from a snapshot outside this repo, see
``_upstream_worker.py``) is the third arm, on the same runsc and the same busybox bundles,
in the pod-like namespaces it needs; without it the arm is skipped, and the run says so.
Target: ours ≤ 1.0× upstream's worker for Run and Restore, ≤ 1.1× for Checkpoint.

Arms alternate, each round starting with the next, so machine noise and order effects hit
all alike; the agent is a real process (its event log fsyncs every event, as in
production). ``--load N`` keeps N busy loops running throughout (a loaded node). Each
target is printed met or MISSED, and a miss exits 1 (tests/bench/_targets.py); below the
table, the door's own share of each call (the call less its effects, timed by the event
log).

**``--scale N``** instead: on the runsc stand-in over real runc (each sandbox a real cgroup
to read), Run→running of a probe actor at 1 live actor (before the others come up and after
they went) vs at N live, split into runsc's share and the door's, and
GetActiveWorkloadStats at both. Target at N live: Run within +10 %, GetActiveWorkloadStats
≤ 50 ms. With ``--profile``, also the Python calls the agent's event loop makes per Run at
each end (cProfile, windows toggled by SIGUSR1: a count that says what grows with the
actors however busy the machine is; its times are inflated by the profiler). ``--hops`` instead: per call, the agent's thread hops, threads started, fsyncs,
event-log records, batches and waits, and runsc commands, counted in the agent process
(``_hops.py``): what a saturated node makes each call wait for, read the same however busy
the machine is. ``--smoke``: one round, a scale of 4, the hops of one round, no verdicts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _hops
import _targets
import _upstream_worker
from service import workerclient
from support import real_runsc

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import bundles, node

OPS = ("run→running", "checkpoint", "restore")
REPO = Path(__file__).resolve().parents[2]
APP = "app"
#: gVisor's multi-container annotations (what the agent's effects write into each bundle).
_TYPE = "io.kubernetes.cri.container-type"
_SANDBOX = "io.kubernetes.cri.sandbox-id"


def _runsc(runsc: Path, root: Path, *args: str, check: bool = True) -> None:
    # No pipes: a sandbox started by create/restore inherits runsc's stdio and keeps it open.
    # A file instead, beside the root, for the error of a failing command.
    root.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.log").open("a") as output:
        done = subprocess.run(
            [str(runsc), "--root", str(root), *real_runsc.GLOBAL_FLAGS, *args],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            check=False,
            timeout=120,
        )
    if check and done.returncode != 0:
        log = (root.parent / f"{root.name}.log").read_text()[-6000:]
        raise RuntimeError(
            f"runsc {' '.join(args)} exited {done.returncode}: {log} {sorted(os.listdir(root))}"
        )


def _direct_bundles(base: Path) -> Path:
    """``_pause`` + ``app`` bundles annotated as one sandbox, as the agent's effects do."""
    directory = base / "direct-bundles"
    bundles.make_bundle(
        directory / "_pause", workerclient.PAUSE_ARGS, annotations={_TYPE: "sandbox"}
    )
    bundles.make_bundle(
        directory / APP,
        workerclient.COUNTER_ARGS,
        annotations={_TYPE: "container", _SANDBOX: "_pause"},
    )
    return directory


def _delete_sandbox(runsc: Path, root: Path) -> None:
    """The agent's delete order: the app (refused once the sandbox has exited), ``_pause``,
    then the app again (its record outlives the sandbox)."""
    _runsc(runsc, root, "delete", "--force", APP, check=False)
    _runsc(runsc, root, "delete", "--force", "_pause")
    _runsc(runsc, root, "delete", "--force", APP)


def direct_round(runsc: Path, base: Path, bundle_dir: Path, i: int) -> list[float]:
    """The runsc commands of one sandbox's run, checkpoint and restore, straight from here."""
    root = base / "direct-root" / str(i)
    image = base / "direct-images" / str(i)
    pause, app = str(bundle_dir / "_pause"), str(bundle_dir / APP)
    # The sandbox's own cgroup, as the worker API gives every sandbox (runsc then makes it).
    config_path = bundle_dir / "_pause" / "config.json"
    config = json.loads(config_path.read_text())
    config["linux"]["cgroupsPath"] = f"/substrate-gpu/bench-direct-{i}"
    config_path.write_text(json.dumps(config))
    t0 = time.perf_counter()
    _runsc(runsc, root, "create", "--bundle", pause, "_pause")
    _runsc(runsc, root, "start", "_pause")
    _runsc(runsc, root, "create", "--bundle", app, APP)
    _runsc(runsc, root, "start", APP)
    t1 = time.perf_counter()
    _runsc(runsc, root, "checkpoint", "--image-path", str(image), "_pause")
    _delete_sandbox(runsc, root)
    t2 = time.perf_counter()
    for name, bundle in (("_pause", pause), (APP, app)):
        _runsc(runsc, root, "create", "--bundle", bundle, name)
        _runsc(
            runsc, root, "restore", "--bundle", bundle, "--image-path", str(image), "--detach", name
        )
    t3 = time.perf_counter()
    _delete_sandbox(runsc, root)
    real_runsc.delete_all(runsc, root)
    return [t1 - t0, t2 - t1, t3 - t2]


def grpc_round(worker: Any, base: Path, i: int, runsc: Path) -> list[float]:
    """The same life through the worker API (fresh bundles each call, as atelet prepares)."""
    actor = workerclient.Actor(base / f"actor-{i}", uid=f"bench-{i}", runsc=str(runsc))
    actor.prepare()
    t0 = time.perf_counter()
    worker.RunWorkload(actor.run(), timeout=120)
    t1 = time.perf_counter()
    worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
    t2 = time.perf_counter()
    shutil.move(actor.checkpoint, actor.restore)  # atelet ships it, then downloads it back
    shutil.rmtree(actor.bundles)
    actor.prepare()
    t2b = time.perf_counter()
    worker.RestoreWorkload(actor.restore_request(), timeout=120)
    t3 = time.perf_counter()
    worker.TerminateWorkload(actor.terminate(), timeout=120)
    return [t1 - t0, t2 - t1, t3 - t2b]


#: Per call: the event that starts its effects and the outcome that ends them (activation).
_SPANS = (
    ((1, "run_requested"), (1, "sandbox_started")),
    ((1, "suspend_requested"), (1, "deleted")),
    ((2, "restore_requested"), (2, "restored")),
)


def effect_times(log: Path, rounds: int) -> list[list[float]]:
    """Per round and call, the seconds the machine's effects took (the log's ``at`` stamps:
    from the event that starts them to the outcome that ends them), so what is left of a
    call's time is the door's own (decoding, checks, registration, the answer)."""
    at: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        body = json.loads(line)
        if "seq" in body and "actor_id" in body:
            at.setdefault((body["actor_id"], body["type"]), body["at"])
    return [
        [
            at[(f"bench-{i}.{end[0]}", end[1])] - at[(f"bench-{i}.{start[0]}", start[1])]
            for start, end in _SPANS
        ]
        for i in range(rounds)
    ]


def _spread(values: list[float]) -> str:
    """``median [p25–p75]`` in ms (the interquartile range: one outlier round moves it
    little)."""
    ms = sorted(v * 1000 for v in values)
    if len(ms) < 2:
        return f"{ms[0]:.1f}"
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    places = 0 if q1 >= 10 else 1
    return f"{statistics.median(ms):.1f} [{q1:.{places}f}–{q3:.{places}f}]"


def start_load(processes: int) -> list[subprocess.Popen[bytes]]:
    """``processes`` busy loops (a loaded node: other pods' work on the same cores)."""
    return [
        subprocess.Popen(["sh", "-c", "while :; do :; done"], stdin=subprocess.DEVNULL)
        for _ in range(processes)
    ]


def stop_load(load: list[subprocess.Popen[bytes]]) -> None:
    for busy in load:
        busy.kill()
    for busy in load:
        busy.wait(timeout=30)


def stop(agent: subprocess.Popen[bytes]) -> None:
    """SIGTERM the agent and wait for it (SIGKILL after a minute)."""
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=60)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def clean_up(runsc: Path, base: Path) -> None:
    """Delete every sandbox either arm made under ``base`` and unmount their netns mounts,
    whatever state a failed round left them in: the agent's actors (a root each) and the
    direct arm's rounds (a round that raised never reached its own clean-up). A root that
    cannot be cleaned is reported and the others still are (this runs in a ``finally``: an
    error here would hide the one that brought it here)."""
    roots = [*sorted((base / "agent-root").glob("*")), *sorted((base / "direct-root").glob("*"))]
    for root in roots:
        if not root.is_dir():
            continue
        try:
            real_runsc.delete_all(runsc, root)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"cleaning up {root} failed: {e}", file=sys.stderr)


def _serving(agent: subprocess.Popen[bytes], sock: Path) -> None:
    """Wait for the agent's worker socket; an agent that exits first is the error."""
    workerclient.wait_until(lambda: sock.exists() or agent.poll() is not None, timeout=30)
    if agent.poll() is not None:
        raise RuntimeError(f"the agent exited ({agent.returncode}) before serving {sock}")


def _upstream_arm(
    binary: str | None, source: str | None, base: Path, runsc: Path
) -> _upstream_worker.UpstreamWorker | None:
    if not binary:
        print(
            "upstream's worker arm: skipped (no binary: pass --upstream-worker PATH or set "
            f"{_upstream_worker.ENV}; scripts/build-upstream-worker.sh SRC_DIR builds it from "
            "an agent-substrate checkout or mirror and prints PATH)"
        )
        return None
    path = Path(binary)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"--upstream-worker {path}: not an executable file")
    return _upstream_worker.UpstreamWorker(
        path, Path(source) if source else _upstream_worker.default_source(path), base, runsc
    )


def _start_agent(
    base: Path,
    runsc: Path,
    sock: Path,
    extra: list[str],
    env: dict[str, str] | None = None,
    event_log: Path | None = None,
    hops: Path | None = None,
    profile: Path | None = None,
) -> subprocess.Popen[bytes]:
    """The agent process; ``hops``: counting its hops into that file; ``profile``: profiled
    between pairs of SIGUSR1, into ``<profile>.<n>`` (``_hops.py``)."""
    flags = [f"--runsc-flag={f}" for f in real_runsc.GLOBAL_FLAGS]
    command = [sys.executable, "-m", "substrate_gpu"]
    if profile is not None:
        command = _hops.profiled_argv(profile, [])
    # The child writes its own copy of the descriptor; the file is read back by path.
    with (base / "agent.stderr").open("w") as stderr:
        return subprocess.Popen(
            [
                *(command if hops is None else _hops.argv(hops, [])),
                "--log-level",
                "WARNING",
                "agent",
                "--worker-socket",
                str(sock),
                "--event-log",
                str(event_log or base / "events.jsonl"),
                "--checkpoint-root",
                str(base / "checkpoints"),
                "--runsc-root",
                str(base / "agent-root"),
                "--runsc",
                str(runsc),
                *flags,
                "--metrics-port",
                "0",
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )


def main_run(args: argparse.Namespace) -> int:
    smoke: bool = args.smoke
    rounds = 1 if smoke else args.rounds
    runsc = real_runsc.find()
    if runsc is None:
        print(
            f"no runsc at {real_runsc.cached_binary()}: run scripts/build-runsc.sh",
            file=sys.stderr,
        )
        required = os.environ.get("SUBSTRATE_GPU_REQUIRE_REAL") == "1"
        return 1 if (required or not smoke) else 0
    times: dict[str, list[list[float]]] = {"ours": [], "direct": []}
    load: list[subprocess.Popen[bytes]] = []
    # A short prefix: the socket's path must stay under 108 bytes (sun_path) even below a
    # deep temporary directory (the suite's tmp_path).
    with tempfile.TemporaryDirectory(prefix="bwa-") as tmp:
        base = Path(tmp)
        sock = base / "worker.sock"
        upstream = _upstream_arm(args.upstream_worker, args.upstream_source, base, runsc)
        agent = _start_agent(base, runsc, sock, [])
        try:
            _serving(agent, sock)
            worker = workerclient.connect(sock)
            bundle_dir = _direct_bundles(base)
            arms: dict[str, Any] = {
                "ours": lambda i: grpc_round(worker, base, i, runsc),
                "direct": lambda i: direct_round(runsc, base, bundle_dir, i),
            }
            if upstream is not None:
                upstream.start()
                times["upstream"] = []
                arms["upstream"] = upstream.round
            load = start_load(args.load)
            loadavg_before = os.getloadavg()[0]
            names = list(arms)
            for i in range(rounds):
                # Each round starts with the next arm: none always runs first (or last).
                for k in range(len(names)):
                    name = names[(i + k) % len(names)]
                    times[name].append(arms[name](i))
            loadavg = max(loadavg_before, os.getloadavg()[0])
        except Exception:
            print((base / "agent.stderr").read_text()[-4000:], file=sys.stderr)
            if upstream is not None and upstream.process is not None:
                print(upstream.tail(), file=sys.stderr)
            raise
        finally:
            stop_load(load)
            try:
                stop(agent)
                if upstream is not None:
                    upstream.stop()
            finally:
                # Each root (ours per actor, the direct arm's per round) holds
                # --network=none's netns mount until deleted: an exception mid-round must
                # not leave them mounted.
                clean_up(runsc, base)
        effects = effect_times(base / "events.jsonl", len(times["ours"]))
    print(f"worker API benchmark: {runsc} ({real_runsc.pinned_version()}), {rounds} round(s),")
    print("_pause + one app CPU sandbox (busybox); ours and direct --platform=systrap")
    print("--network=none, upstream's worker as it runs (its veth network, runsc's defaults);")
    print(
        f"load: {args.load} busy process(es) on {os.cpu_count()} CPU(s), load average {loadavg:.1f}"
    )
    print(
        "median [interquartile range] ms per call; arms alternate, each round starting with the next\n"
    )
    targets = _targets.Targets(smoke=smoke)
    report(times["ours"], times["direct"], targets)
    print("\nof which the door's own (the call less the machine's effects, from the log):")
    for k, op in enumerate(OPS):
        own = statistics.median(g[k] - e[k] for g, e in zip(times["ours"], effects, strict=True))
        print(f"{op:<16}{own * 1000:>10.1f} ms")
    if "upstream" in times:
        print()
        report_upstream(times["ours"], times["upstream"], targets)
    print("\nupstream (agent-substrate, CPU actor): restore 196–294 ms, checkpoint 212–243 ms")
    return targets.exit_status()


# --- hops: what each call waits for, counted ----------------------------------------------------

#: The calls whose hops are counted, in a round's order.
HOP_CALLS = ("Run", "Checkpoint", "Restore", "Terminate")


def hops_round(worker: Any, base: Path, i: int, runsc: Path) -> dict[str, tuple[float, float]]:
    """One actor's life through the worker API; each call's wall-clock window."""
    actor = workerclient.Actor(base / f"hops-{i}", uid=f"hops-{i}", runsc=str(runsc))
    actor.prepare()
    windows: dict[str, tuple[float, float]] = {}

    def timed(name: str, call: Any, request: Any) -> None:
        start = time.time()
        call(request, timeout=120)
        windows[name] = (start, time.time())

    timed("Run", worker.RunWorkload, actor.run())
    timed("Checkpoint", worker.CheckpointWorkload, actor.checkpoint_request())
    shutil.move(actor.checkpoint, actor.restore)
    shutil.rmtree(actor.bundles)
    actor.prepare()
    timed("Restore", worker.RestoreWorkload, actor.restore_request())
    timed("Terminate", worker.TerminateWorkload, actor.terminate())
    return windows


def hops_run(rounds: int) -> int:
    """``--hops``: per call, the agent's thread hops, fsyncs, log batches, records awaited
    and runsc commands (tests/bench/_hops.py), on real runsc; the first round is a warm-up
    (runsc's features are asked once) and not counted."""
    runsc = real_runsc.find()
    if runsc is None:
        print(f"no runsc at {real_runsc.cached_binary()}: run scripts/build-runsc.sh")
        return 0
    with tempfile.TemporaryDirectory(prefix="bwh-") as tmp:
        base = Path(tmp)
        sock = base / "worker.sock"
        notes = base / "hops.jsonl"
        agent = _start_agent(base, runsc, sock, [], hops=notes)
        windows = []
        try:
            _serving(agent, sock)
            worker = workerclient.connect(sock)
            for i in range(rounds + 1):
                windows.append(hops_round(worker, base, i, runsc))
        except Exception:
            print((base / "agent.stderr").read_text()[-4000:], file=sys.stderr)
            raise
        finally:
            try:
                stop(agent)
            finally:
                clean_up(runsc, base)
        taken = _hops.read(notes)
    print(f"hops per call: {runsc}, {rounds} counted round(s) after a warm-up; per round,")
    print("the fewest and the most (a batch can carry another call's record)\n")
    print(f"{'call':<11}" + "".join(f"{k:>16}" for k in _hops.KINDS))
    details: dict[str, Any] = {}
    for call in HOP_CALLS:
        per_round = [_hops.count(taken, *w[call]) for w in windows[1:]]
        cells = []
        for kind in _hops.KINDS:
            counts = [kinds[kind] for kinds, _ in per_round]
            low, high = min(counts), max(counts)
            cells.append(f"{low}" if low == high else f"{low}–{high}")
        print(f"{call:<11}" + "".join(f"{c:>16}" for c in cells))
        details[call] = per_round[-1][1]
    print("\nwhat, in the last round:")
    for call in HOP_CALLS:
        listed = ", ".join(
            f"{what} ×{n}" if n > 1 else what
            for (kind, what), n in sorted(details[call].items())
            if kind in ("thread hops", "log records", "runsc commands")
        )
        print(f"  {call}: {listed}")
    return 0


# --- scale: many live actors on the stand-in runtime ------------------------------------------

#: Run/Terminate cycles of the probe actor at each end of a scale run, and stats calls.
SCALE_PROBES = 7
#: The live actors' app: idle (1,000 counters would be a load generator of their own).
IDLE = list(workerclient.PAUSE_ARGS)
#: Live actors of the scale part of a --smoke run.
SMOKE_SCALE = 4
STATS_CALLS = 21
#: Runs in flight at once while the other actors are brought up (and torn down).
FILL_WORKERS = 4


class Probe:
    """The actor whose Runs are timed; each Run is a new activation (``<uid>.<n>``)."""

    def __init__(self, worker: Any, actor: workerclient.Actor) -> None:
        self.worker, self.actor, self.activations = worker, actor, 0

    def run(self) -> str:
        """Run→running (fresh bundles first); the activation's id."""
        shutil.rmtree(self.actor.bundles, ignore_errors=True)
        self.actor.prepare()
        self.worker.RunWorkload(self.actor.run(), timeout=120)
        self.activations += 1
        return f"{self.actor.uid}.{self.activations}"

    def timed(self, cycles: int) -> list[tuple[float, str]]:
        """``cycles`` timed Runs, each Terminated outside the timing."""
        times = []
        for _ in range(cycles):
            t0 = time.perf_counter()
            activation = self.run()
            times.append((time.perf_counter() - t0, activation))
            self.worker.TerminateWorkload(self.actor.terminate(), timeout=120)
        return times


def _run_effects(log: Path) -> dict[str, float]:
    """Per activation, run_requested → sandbox_started from the log's stamps (runsc's share)."""
    at: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        body = json.loads(line)
        if "seq" in body and "actor_id" in body:
            at.setdefault((body["actor_id"], body["type"]), body["at"])
    return {
        actor: at[(actor, "sandbox_started")] - start
        for (actor, kind), start in at.items()
        if kind == "run_requested" and (actor, "sandbox_started") in at
    }


def teardown(worker: Any, started: list[workerclient.Actor]) -> None:
    """Terminate every actor brought up (several at a time), emptying ``started``."""
    with concurrent.futures.ThreadPoolExecutor(FILL_WORKERS) as pool:
        list(pool.map(lambda a: worker.TerminateWorkload(a.terminate(), timeout=300), started))
    started.clear()


def _timed_stats(worker: Any, expected: int) -> list[float]:
    times = []
    for _ in range(STATS_CALLS):
        t0 = time.perf_counter()
        answer = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest())
        times.append(time.perf_counter() - t0)
        if len(answer.samples) != expected:
            raise RuntimeError(f"{len(answer.samples)} samples for {expected} live actors")
        measured = sum(s.source == pb.STATS_SOURCE_CGROUP for s in answer.samples)
        if measured != expected:
            raise RuntimeError(f"{measured} of {expected} samples read from a cgroup")
    return times


def scale_run(live: int, smoke: bool, targets: _targets.Targets, *, profile: bool = False) -> None:
    """Run→running at 1 live actor (before the others come up and after they went) vs at
    ``live``, and GetActiveWorkloadStats at both, on the runsc stand-in over real runc (so
    each sandbox has its real cgroup to read). ``profile``: also the Python calls the
    agent's event loop makes per Run at each end (a count: what grows with the actors,
    whatever the machine's load)."""
    runc = shutil.which("runc")
    if runc is None:
        raise FileNotFoundError("the scale mode needs runc (the runsc stand-in runs over it)")
    with tempfile.TemporaryDirectory(prefix="bwa-scale-") as tmp:
        base = Path(tmp)
        sock = base / "worker.sock"
        standin = node.install_runsc_standin(base / "bin")
        profiled = base / "profile" if profile else None
        agent = _start_agent(
            base,
            standin,
            sock,
            ["--max-actors", str(max(live, 1))],
            {"RUNSC_STANDIN_RUNC": runc},
            profile=profiled,
        )

        def profiling() -> None:
            if profiled is not None:
                agent.send_signal(signal.SIGUSR1)
                time.sleep(0.5)  # the next call starts inside the window

        others = [
            workerclient.Actor(
                base / "actors" / str(i), uid=f"scale-{i}", app_args=IDLE, runsc=str(standin)
            )
            for i in range(live - 1)
        ]
        started: list[workerclient.Actor] = []
        try:
            _serving(agent, sock)
            worker = workerclient.connect(sock)
            probe = Probe(
                worker,
                workerclient.Actor(
                    base / "probe", uid="scale-probe", app_args=IDLE, runsc=str(standin)
                ),
            )
            probe.timed(1)  # the first call's warm-up
            profiling()
            run_one = probe.timed(SCALE_PROBES)
            profiling()
            probe.run()
            stats_one = _timed_stats(worker, 1)
            worker.TerminateWorkload(probe.actor.terminate(), timeout=120)
            t0 = time.perf_counter()

            def bring_up(actor: workerclient.Actor) -> None:
                worker.RunWorkload(actor.prepare().run(), timeout=300)
                started.append(actor)

            with concurrent.futures.ThreadPoolExecutor(FILL_WORKERS) as pool:
                list(pool.map(bring_up, others))
            fill = time.perf_counter() - t0
            profiling()
            run_many = probe.timed(SCALE_PROBES)
            profiling()
            probe.run()
            stats_many = _timed_stats(worker, live)
            worker.TerminateWorkload(probe.actor.terminate(), timeout=120)
            teardown(worker, started)
            # 1 live again: the same figure before and after brackets the machine's drift.
            run_one += probe.timed(SCALE_PROBES)
        except Exception:
            print((base / "agent.stderr").read_text()[-4000:], file=sys.stderr)
            raise
        finally:
            if started:
                teardown(worker, started)
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=120)
            for root in (base / "agent-root").glob("*"):
                _delete_runc_root(runc, root)
        effects = _run_effects(base / "events.jsonl")
        calls = (
            [_hops.python_calls(profiled, k) / SCALE_PROBES for k in (0, 1)]
            if profiled is not None
            else None
        )
    print(f"\nscale: {live} live actors (_pause + app each) on the runsc stand-in over runc,")
    print(f"brought up {FILL_WORKERS} at a time in {fill:.0f} s; median [interquartile range] ms")
    print(f"{'':<26}{'at 1 live':>22}{f'at {live} live':>22}{'change':>9}  target")
    r1, rn = (statistics.median(t for t, _ in runs) for runs in (run_one, run_many))
    verdict = targets.judge(f"Run at {live} live ≤ +10 %", rn <= r1 * 1.10)
    print(
        f"{'Run→running':<26}{_spread([t for t, _ in run_one]):>22}"
        f"{_spread([t for t, _ in run_many]):>22}{(rn / r1 - 1) * 100:>+8.1f}%  {verdict}"
    )
    for label, share in (
        ("  of which runsc's", lambda t, a: effects[a]),
        ("  of which the door's", lambda t, a: t - effects[a]),
    ):
        one = [share(t, a) for t, a in run_one]
        many = [share(t, a) for t, a in run_many]
        change = (statistics.median(many) / statistics.median(one) - 1) * 100
        print(f"{label:<26}{_spread(one):>22}{_spread(many):>22}{change:>+8.1f}%")
    if calls is not None:
        print(
            f"{'  Python calls per Run':<26}{calls[0]:>22.0f}{calls[1]:>22.0f}"
            f"{(calls[1] / calls[0] - 1) * 100:>+8.1f}%  (the agent's event loop, cProfile)"
        )
    s1, sn = statistics.median(stats_one), statistics.median(stats_many)
    verdict = targets.judge("GetActiveWorkloadStats ≤ 50 ms", sn <= 0.050)
    print(
        f"{'GetActiveWorkloadStats':<26}{_spread(stats_one):>22}{_spread(stats_many):>22}"
        f"{(sn - s1) / max(live - 1, 1) * 1000:>+7.3f}/actor ms  {verdict}"
    )


def _delete_runc_root(runc: str, root: Path) -> None:
    """Every container runc still knows under ``root`` force-deleted (after a failure)."""
    listed = subprocess.run(
        [runc, "--root", str(root), "list", "-q"], capture_output=True, text=True, check=False
    )
    for container_id in listed.stdout.split():
        subprocess.run([runc, "--root", str(root), "delete", "--force", container_id], check=False)


#: Ours over upstream's worker, per call, at most (issue 31 §9).
UPSTREAM_RATIO = {"run→running": 1.0, "checkpoint": 1.1, "restore": 1.0}


def report_upstream(
    ours: list[list[float]], upstream: list[list[float]], targets: _targets.Targets
) -> None:
    """Per call, ours beside upstream's own worker, and the ratio judged."""
    print(f"{'call':<16}{'ours ms':>22}{'upstream ms':>22}{'ours/upstream':>15}  target")
    for k, op in enumerate(OPS):
        o = statistics.median(t[k] for t in ours)
        u = statistics.median(t[k] for t in upstream)
        ratio = o / u
        bound = UPSTREAM_RATIO[op]
        verdict = targets.judge(f"{op} ≤ {bound}× upstream", ratio <= bound)
        print(
            f"{op:<16}{_spread([t[k] for t in ours]):>22}{_spread([t[k] for t in upstream]):>22}"
            f"{ratio:>14.2f}×  {verdict}"
        )


def report(
    grpc_times: list[list[float]], direct_times: list[list[float]], targets: _targets.Targets
) -> None:
    """Per call: the medians and what the door adds, judged against both bounds (at most
    10 % *and* at most 25 ms). A negative "added" cannot be the door's cost: it says the
    direct arm was slowed by something else (noise, an order effect), flagged, not judged."""
    print(f"{'call':<16}{'gRPC ms':>22}{'direct ms':>22}{'added':>10}{'%':>8}  targets")
    for k, op in enumerate(OPS):
        g = statistics.median(t[k] for t in grpc_times) * 1000
        d = statistics.median(t[k] for t in direct_times) * 1000
        over, pct = g - d, (g - d) / d * 100
        relative = targets.judge(f"{op} ≤ 10 %", pct <= 10)
        absolute = targets.judge(f"{op} ≤ 25 ms", over <= 25)
        flag = "  (negative: a measurement problem, not a gain)" if over < 0 else ""
        print(
            f"{op:<16}{_spread([t[k] for t in grpc_times]):>22}"
            f"{_spread([t[k] for t in direct_times]):>22}{over:>+9.1f} {pct:>+7.1f}  "
            f"{relative}, {absolute}{flag}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="one round, no verdicts")
    parser.add_argument(
        "--upstream-worker",
        default=os.environ.get(_upstream_worker.ENV),
        metavar="PATH",
        help=f"upstream's ateom-gvisor binary: the third arm (default ${_upstream_worker.ENV})",
    )
    parser.add_argument(
        "--upstream-source",
        metavar="DIR",
        help="the snapshot it was built from, for its ateom.proto (default: PATH's dir/src)",
    )
    parser.add_argument("--load", type=int, default=0, metavar="N", help="N busy processes")
    parser.add_argument(
        "--scale",
        type=int,
        metavar="N",
        help="instead: Run and GetActiveWorkloadStats at 1 vs N live actors (stand-in runsc)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --scale: the Python calls per Run of the agent's event loop at each end",
    )
    parser.add_argument(
        "--hops",
        action="store_true",
        help="instead: count each call's thread hops, fsyncs and runsc commands (real runsc)",
    )
    args = parser.parse_args()
    if args.hops:
        return hops_run(1 if args.smoke else args.rounds)
    if args.scale is not None:
        targets = _targets.Targets(smoke=args.smoke)
        load = start_load(args.load)
        try:
            scale_run(args.scale, args.smoke, targets, profile=args.profile)
        finally:
            stop_load(load)
        return targets.exit_status()
    status = main_run(args)
    if args.smoke:
        scale_run(SMOKE_SCALE, smoke=True, targets=_targets.Targets(smoke=True))
        hops_run(1)
    return status


if __name__ == "__main__":
    sys.exit(main())
