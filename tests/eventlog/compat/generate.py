"""Write the compatibility fixtures: event logs as the agent of this checkout writes them.

Run once per on-disk format, with the code that writes it:
``.venv/bin/python tests/eventlog/compat/generate.py DIR``. The fixtures in ``v1/`` were
written by the json + dataclass codec (before events moved to msgspec, issue 17), and every
later agent must replay them to exactly the states and transitions recorded beside them
(``*.expected.json``, also written by that code): see ``test_compat.py``.

- ``every_type.jsonl``: one line of every event type (fields from the test factories) and a
  rejection: read back, each must re-encode to the same JSON object;
- ``bench_life.jsonl``: the event-log benchmark's log (one GPU actor's real life, stamped
  out for 3 actors, interleaved);
- ``demo.jsonl``: the demo's log (simulated runtime);
- ``short_life.jsonl``: the eventlog tests' three actors, with rotation: the segment
  continues a snapshot (``short_life.jsonl.snapshot-*.json``).
"""

from __future__ import annotations

import functools
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import msgspec

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "bench"))


def _expected(log: Path) -> dict[str, object]:
    from substrate_gpu.eventlog import replay

    result = replay(log)
    return {
        "final": {a: msgspec.structs.asdict(v) for a, v in sorted(result.actors.items())},
        "transitions": [
            [t.actor_id, t.event_type, t.source, t.dest, t.at, t.reason] for t in result.transitions
        ],
        "rejections": [[r.actor_id, r.event.type, r.state] for r in result.rejections],
        "last_seq": result.last_seq,
        "snapshot_seq": result.snapshot_seq,
    }


def _every_type(path: Path) -> None:
    from lifecycle.factories import make_event

    from substrate_gpu.eventlog import format
    from substrate_gpu.lifecycle import events

    lines = [format.Header(v=format.VERSION).to_json()]
    for seq, kind in enumerate(sorted(events.REGISTRY), start=1):
        event = make_event(kind, actor_id=f"actor-{seq}", at=1767225600.0 + seq / 8)
        lines.append(event.stamped(seq).to_json())
    refused = events.SuspendRequested(actor_id="actor-x", at=1767225700.5)
    lines.append(format.Rejection(event=refused, state="registered", problem="why").to_json())
    path.write_text("".join(line + "\n" for line in lines))


def main(out: Path) -> None:
    import bench_eventlog

    from eventlog.logs import short_life
    from substrate_gpu.testing import demo

    out.mkdir(parents=True, exist_ok=True)
    _every_type(out / "every_type.jsonl")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        template = anyio.run(bench_eventlog._template, tmp)
        log = tmp / "bench.jsonl"
        anyio.run(bench_eventlog._create_empty, log)
        bench_eventlog._generate(log, template, 3 * len(template))
        shutil.copyfile(log, out / "bench_life.jsonl")

        demo.choose_runtime = lambda: (None, "in-process simulated runsc (fixture)")  # type: ignore[assignment]
        result = demo.main(tmp / "demo", io.StringIO())
        shutil.copyfile(result.event_log, out / "demo.jsonl")

        rotated = tmp / "rot" / "short_life.jsonl"
        rotated.parent.mkdir()
        anyio.run(functools.partial(short_life, rotated, tmp, rotate_bytes=1500))
        for file in rotated.parent.iterdir():
            shutil.copyfile(file, out / file.name)
    for name in ("bench_life", "demo", "short_life"):
        expected = _expected(out / f"{name}.jsonl")
        (out / f"{name}.expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
