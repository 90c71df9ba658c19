"""Benchmark: the msgspec codec against the json + dataclass decoder it replaced (issue 17).

Run: ``.venv/bin/python tests/bench/bench_codec.py [--events 1000000] [--smoke]``.
Not collected by pytest. Side by side, in one run, on the same 1,000,000-event log (the
event-log benchmark's: one GPU actor's real life, stamped out):

- **parse alone**: today's decoder (msgspec ``decode_lines`` into the tagged union, inside
  ``read_log``) against the old one, kept *here* as a copy (one ``json.loads`` per chunk of
  lines, then a decoder generated with ``exec()`` per event type building frozen
  dataclasses). Target ≥ 1,000,000 events/s.
- **the whole replay()**: the old commit's own ``replay()`` (its tree extracted with ``git
  archive`` into a temporary directory and run in a subprocess) against this checkout's, on
  the same lives registered by ``actor_registered`` v1 (no allocator: the old commit cannot
  read v2 registrations or ``gpus_allocated``); and this checkout's on today's full log
  against the commit before the replay hot-path work (``--base-commit``). Target ≥ 400,000
  events/s. The load average is printed: on a shared machine, read the ratios.
- **agent answer latency per line** (parse + log + apply: ``AgentService.handle_line`` on a
  log in /dev/shm, so the fsync does not drown the rest): the old commit, the base commit
  and this checkout, the same script in each, interleaved, best of ``--repeat``; plus
  request parsing alone, the old ``json.loads`` + ``from_dict`` path (copied here) against
  ``protocol.parse_request``.

``--smoke``: tiny sizes, one repetition, no targets judged (seconds; the suite runs it).
Without git or the old commit, the old-commit figures are reported as unavailable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # tests/, for lifecycle.*
sys.path.insert(0, str(HERE))

import _targets  # noqa: E402
import bench_eventlog  # noqa: E402

from substrate_gpu.eventlog import read_log, replay  # noqa: E402
from substrate_gpu.lifecycle import events  # noqa: E402
from substrate_gpu.service import protocol  # noqa: E402

#: The last commit with the json + dataclass codec.
OLD_COMMIT = "ecad4b9"
#: The last commit before the replay hot path was compiled (moves, advance, '}\\n{' check).
BASE_COMMIT = "6d0cad0"


# --- the old decoder, copied (substrate_gpu/eventlog/format.py and reader.py at OLD_COMMIT) ---


def _old_annotation(annotation: object) -> str:
    """The old dataclass annotation of a Struct field's type (what its checks keyed on)."""
    base = (
        typing.get_args(annotation)[0]
        if typing.get_origin(annotation) is typing.Annotated
        else annotation
    )
    if typing.get_origin(base) is typing.Literal:
        return type(typing.get_args(base)[0]).__name__
    if base == str | None:
        return "str | None"
    return typing.cast(type, base).__name__


def _old_event_classes() -> dict[str, type]:
    """Frozen dataclasses with the fields of today's event types (the old classes' shape)."""
    out: dict[str, type] = {}
    for name, cls in events.REGISTRY.items():
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = [
            (f.name, _old_annotation(hints[f.name]), dataclasses.field(default=None))
            for f in msgspec.structs.fields(cls)
            if f.name != "v"
        ]
        old = dataclasses.make_dataclass(
            cls.__name__,
            [
                ("type", ClassVar[str], dataclasses.field(default=name)),
                ("v", ClassVar[int], dataclasses.field(default=1)),
                *fields,
            ],
            frozen=True,
            kw_only=True,
        )
        out[name] = old
    return out


_CHECK_TEMPLATES: dict[str, str] = {
    "str": "    if type({v}) is not str: return None\n",
    "int": "    if type({v}) is not int: return None\n",
    "bool": "    if type({v}) is not bool: return None\n",
    "float": (
        "    if type({v}) is not float:\n"
        "        if type({v}) is not int: return None\n"
        "        {v} = float({v})\n"
    ),
    "str | None": "    if {v} is not None and type({v}) is not str: return None\n",
    # Added with GPU allocation (gpus_allocated.names, actor_registered.gpu_names).
    "tuple": "    if type({v}) is not list: return None\n    {v} = tuple({v})\n",
    # Added with sandboxes (actor_registered.identity, issue 23).
    "dict": "    if type({v}) is not dict: return None\n",
}


_VERSIONS: dict[str, int] = {
    name: next(f.default for f in msgspec.structs.fields(c) if f.name == "v")
    for name, c in events.REGISTRY.items()
}


def _compile_decoder(cls: type) -> Callable[[dict[str, Any]], object | None]:
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    lines = ["def decode(d):\n", "    if d.keys() != KEYS or d['v'] != VERSION: return None\n"]
    for i, f in enumerate(fields):
        lines.append(f"    v{i} = d[{f.name!r}]\n")
        lines.append(_CHECK_TEMPLATES[str(f.type)].format(v=f"v{i}"))
    values = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    lines.append("    e = NEW(CLS)\n")
    lines.append(f"    SET(e, '__dict__', {{{values}}})\n")
    lines.append("    return e\n")
    namespace: dict[str, Any] = {
        "KEYS": frozenset({"type", "v", *names}),
        # Today's version of the type (actor_registered is v2 since GPU allocation).
        "VERSION": _VERSIONS[cls.type],  # type: ignore[attr-defined]
        "NEW": object.__new__,
        "SET": object.__setattr__,
        "CLS": cls,
    }
    exec("".join(lines), namespace)
    return namespace["decode"]  # type: ignore[no-any-return]


def _old_parse_block(block: bytes, count: int) -> list[dict[str, object]] | None:
    if not (block.startswith(b"{") and block.endswith(b"}")):
        return None
    if block.count(b"}\n{") != count - 1:
        return None
    try:
        parsed = json.loads(b"[" + block.replace(b"\n", b",") + b"]")
    except ValueError:
        return None
    if len(parsed) != count or not all(type(item) is dict for item in parsed):
        return None
    return parsed  # type: ignore[no-any-return]


class OldDecoder:
    """The old read + parse of a log's records (fast path; a miss is an error here)."""

    def __init__(self) -> None:
        self.classes = _old_event_classes()
        self.decoders = {name: _compile_decoder(cls) for name, cls in self.classes.items()}

    def read(self, path: Path) -> list[object]:
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        start = data.index(b"\n") + 1
        json.loads(data[: start - 1])  # the header
        out: list[object] = []
        fast = self.decoders
        with _gc_paused():
            while start < end:
                stop = data.find(b"\n", min(start + (256 << 10), end - 1))
                block = data[start:stop]
                parsed = _old_parse_block(block, block.count(b"\n") + 1)
                if parsed is None:
                    raise ValueError("the old fast path refused a chunk")
                for item in parsed:
                    record = fast[item["type"]](item)  # type: ignore[index]
                    if record is None:
                        raise ValueError(f"the old fast path refused {item!r}")
                    out.append(record)
                start = stop + 1
            last = 0
            for record in out:  # the old reader's order check
                if record.seq <= last:  # type: ignore[attr-defined]
                    raise ValueError("seq out of order")
                last = record.seq  # type: ignore[attr-defined]
        return out

    def parse_request(self, line: bytes) -> object:
        """The old protocol.parse_request's decoding: json.loads + checks + from_dict."""
        data = json.loads(line)
        if not isinstance(data, dict) or "seq" in data:
            raise ValueError("refused")
        record = self.decoders[data["type"]]({**data, "seq": 0, "at": data.get("at", time.time())})
        if record is None:
            raise ValueError("refused")
        return record


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# --- the old commit, run as it was -------------------------------------------------------------


def _old_tree(tmp: Path, commit: str, name: str) -> Path | None:
    """The old commit's package, machine and test doubles, extracted; None without git."""
    tree = tmp / name
    archive = tmp / f"{name}.tar"
    try:
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                "-o",
                str(archive),
                commit,
                "substrate_gpu",
                "machines",
                "tests/lifecycle",
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


_REPLAY = textwrap.dedent(
    """
    import gc, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from substrate_gpu.eventlog import replay
    best = float("inf")
    for _ in range(int(sys.argv[3])):
        gc.collect()
        started = time.perf_counter()
        result = replay(Path(sys.argv[2]))
        best = min(best, time.perf_counter() - started)
    print(best, result.events_replayed)
    """
)

_AGENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import anyio
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
    from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime
    from substrate_gpu.eventlog import EventLog
    from substrate_gpu.lifecycle import Agent
    from substrate_gpu.service.door import AgentService

    async def main(directory, n):
        runtime = FakeRuntime()
        lines = [
            json.dumps({"type": "actor_registered", "v": 1, "actor_id": f"a{i}", "gpu": False,
                        "bundle": f"/b/{i}"}).encode()
            for i in range(n)
        ]
        async with await EventLog.open(Path(directory) / "agent.jsonl", rotate_bytes=None) as log:
            async with Agent(runtime=runtime, probe=FakeProbe(runtime), injector=FakeInjector(),
                             checkpoint_root=Path("/ck"), recorder=log) as agent:
                service = AgentService(agent)
                started = time.perf_counter()
                for i, line in enumerate(lines):
                    answer = await service.handle_line(line, i + 1)
                elapsed = time.perf_counter() - started
                assert b'"ok":true' in answer, answer
        print(elapsed / n)

    anyio.run(main, sys.argv[2], int(sys.argv[3]))
    """
)


def _run(script: str, *argv: str) -> list[str] | None:
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(f"  (subprocess failed: {done.stderr.strip().splitlines()[-1:]})")
        return None
    return done.stdout.split()


_timed = bench_eventlog._timed


def _per_line(fn: Callable[[bytes], object], lines: list[bytes], repeat: int) -> float:
    def all_lines() -> None:
        for line in lines:
            fn(line)

    return _timed(all_lines, repeat)[0] / len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=Path("/var/tmp"), help="where the log goes")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the log")
    parser.add_argument("--requests", type=int, default=2_000, help="agent request lines")
    parser.add_argument("--repeat", type=int, default=3, help="timings: best of N")
    parser.add_argument(
        "--old-commit", default=OLD_COMMIT, help="the json + dataclass codec's commit"
    )
    parser.add_argument(
        "--base-commit", default=BASE_COMMIT, help="the commit before the replay speed-ups"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no targets judged")
    args = parser.parse_args()
    if args.smoke:
        args.events, args.requests, args.repeat = 3_000, 50, 1
    shm = Path("/dev/shm")

    with tempfile.TemporaryDirectory(dir=args.base, prefix="bench-codec-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"codec benchmark in {tmp} ({os.uname().sysname}, {os.cpu_count()} CPUs)\n")
        template = anyio.run(bench_eventlog._template, tmp)
        log = tmp / "replay.jsonl"
        anyio.run(bench_eventlog._create_empty, log)
        n = bench_eventlog._generate(log, template, args.events)
        # The old commit cannot read today's actor_registered v2 / gpus_allocated lines: the
        # side-by-side replay runs on the same lives registered as v1 (no allocator).
        template_v1 = anyio.run(functools.partial(bench_eventlog._template, registration=1), tmp)
        log_v1 = tmp / "replay-v1.jsonl"
        anyio.run(bench_eventlog._create_empty, log_v1)
        n_v1 = bench_eventlog._generate(log_v1, template_v1, args.events)
        print(
            f"logs: {n:,} events, {log.stat().st_size / 2**20:.0f} MiB (today's lives); "
            f"{n_v1:,} events, {log_v1.stat().st_size / 2**20:.0f} MiB (v1 registrations)\n"
        )

        old = OldDecoder()
        old_s, old_records = _timed(lambda: old.read(log), args.repeat)
        new_s, contents = _timed(lambda: read_log(log), args.repeat)
        assert len(old_records) == len(contents.records) == n  # type: ignore[arg-type, attr-defined]
        del old_records, contents
        new_replay_s, result = _timed(lambda: replay(log), args.repeat)
        assert result.events_replayed == n  # type: ignore[attr-defined]
        new_v1_s, result = _timed(lambda: replay(log_v1), args.repeat)
        assert result.events_replayed == n_v1  # type: ignore[attr-defined]
        del result
        tree = _old_tree(tmp, args.old_commit, "old-tree")
        old_v1 = _run(_REPLAY, str(tree), str(log_v1), str(args.repeat)) if tree else None
        old_v1_s = float(old_v1[0]) if old_v1 else None
        # This change's own comparison: the commit before it, on today's full log.
        base = _old_tree(tmp, args.base_commit, "base-tree")
        base_replay = _run(_REPLAY, str(base), str(log), str(args.repeat)) if base else None
        base_s = float(base_replay[0]) if base_replay else None

        print(f"  {'':<44} {'before':>12} {'now':>12} {'speed-up':>9}")
        rows: list[tuple[str, float | None, float]] = [
            ("parse alone (read_log), json copy", n / old_s, n / new_s),
            (f"replay(), v1 log, {args.old_commit} (json)", n_v1 / old_v1_s if old_v1_s else None,
             n_v1 / new_v1_s),
            (f"replay(), full log, {args.base_commit}", n / base_s if base_s else None,
             n / new_replay_s),
        ]  # fmt: skip
        for name, before, after in rows:
            b = f"{before:>12,.0f}" if before else f"{'unavailable':>12}"
            ratio = f"{after / before:>8.2f}x" if before else f"{'':>9}"
            print(f"  {name:<44} {b} {after:>12,.0f} {ratio}")
        print(
            f"  (load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )

        requests = [
            json.dumps(
                {"type": "cuda_context_opened", "v": 1, "actor_id": f"a{i}", "pid": i}
            ).encode()
            for i in range(args.requests)
        ]
        old_parse = _per_line(old.parse_request, requests, args.repeat)
        new_parse = _per_line(protocol.parse_request, requests, args.repeat)
        directory = shm if shm.is_dir() else tmp
        latency: dict[str, float | None] = {}
        for _ in range(args.repeat):  # interleaved, best of: one run is at the load's mercy
            for label, root in (("json", tree), ("base", base), ("now", ROOT)):
                with tempfile.TemporaryDirectory(dir=directory) as agent_dir:
                    answer = (
                        _run(_AGENT, str(root), agent_dir, str(args.requests)) if root else None
                    )
                best = latency.get(label)
                if answer is not None:
                    latency[label] = (
                        float(answer[0]) if best is None else min(best, float(answer[0]))
                    )
                else:
                    latency.setdefault(label, None)
        print(f"\n  {'agent answer, µs per line':<40} {'json':>10} {'base':>10} {'now':>10}")
        print(
            f"  {'request parse alone':<40} {old_parse * 1e6:>10.2f} {'':>10} {new_parse * 1e6:>10.2f}"
        )
        cells = " ".join(
            f"{v * 1e6:>10.1f}" if v else f"{'unavailable':>10}" for v in latency.values()
        )
        print(f"  {'parse + log (' + directory.name + ') + apply':<40} {cells}")
        print(f"  (json: {args.old_commit}; base: {args.base_commit}; now: this checkout)")

        targets = _targets.Targets(smoke=args.smoke)
        print()
        for name, figure, target in (
            ("parse", n / new_s, 1_000_000),
            ("replay()", n / new_replay_s, 400_000),
        ):
            verdict = targets.judge(f"target {name} ≥ {target:,} events/s", figure >= target)
            print(f"  {verdict} ({figure:,.0f})")
    return targets.exit_status()


if __name__ == "__main__":
    sys.exit(main())
