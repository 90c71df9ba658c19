"""``substrate-gpu replay LOG [--actor ID] [--json]``: each actor's timeline and final state.

Replays the event log through the lifecycle machine without running any effect
(docs/event-log.md). Exit codes: 0 when the log replays (a torn last line is a warning on
stderr, not a failure: it was never acknowledged); 1 when the log is unreadable, is not an
event log at all, is corrupt or diverges from the machine (the message names the file and
line), or when ``--actor`` names an actor the log never saw (the closest ids are named).
Output cut short by its reader (``replay LOG | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from substrate_gpu.cli import _errors
from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_OK

# The event log and the lifecycle are imported by the functions that use them: every other
# command of the CLI starts without them.
if TYPE_CHECKING:
    import msgspec

    from substrate_gpu import eventlog
    from substrate_gpu.eventlog import format, reader
    from substrate_gpu.lifecycle import hooks

_HEADER_PEEK_BYTES = 64 << 10
"""How much of a file is read to tell whether it starts with an event-log header."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay``."""
    parser = subparsers.add_parser(
        "replay",
        help="replay an event log: each actor's timeline and final state",
        description="Rebuild every actor's state from an event log, running no effect, "
        "and print each actor's timeline (seq, time, event, from -> to) and final state.",
    )
    parser.add_argument("log", type=Path, metavar="LOG", help="the event log (events.jsonl)")
    parser.add_argument("--actor", metavar="ID", help="only this actor")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """The ``replay`` handler."""
    from substrate_gpu import eventlog  # noqa: PLC0415
    from substrate_gpu.eventlog import format, reader, replayer  # noqa: PLC0415

    path: Path = args.log
    try:
        contents = reader.read_log(path)
        result = replayer.replay_contents(contents, actor=args.actor)
    except eventlog.CorruptLogError as e:
        message = _errors.describe(e)
        if e.line == 1 and not starts_with_log_header(path):
            message = (
                f"{path} is not an event log: its first line is not a {format.FORMAT} "
                "header; give the file the agent writes (agent --event-log)"
            )
        return _fail(message)
    except eventlog.EventLogError as e:
        return _fail(_errors.describe(e))
    actor: str | None = args.actor
    if actor is not None and actor not in result.actors and actor not in _actor_ids(contents):
        return _fail(_unknown_actor(path, actor, _actor_ids(contents)))
    if contents.torn_tail is not None:
        print(
            f"substrate-gpu replay: warning: {path}: {contents.torn_tail.describe()}",
            file=sys.stderr,
        )
    if contents.missing:
        print(
            f"substrate-gpu replay: warning: {path}: {contents.describe_missing()} missing "
            "from the log (below its last event, so not a torn tail: a line taken out, or a "
            "tail lost at an earlier start); replayed without them",
            file=sys.stderr,
        )
    _warn_unshowable_times(path, contents)
    timelines = _timelines(contents, result, args.actor)
    # A reader that leaves (`| head`) is main's to handle, as for every command.
    if args.json:
        json.dump(_document(result, timelines), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        _print_text(sys.stdout, result, timelines)
    sys.stdout.flush()
    return EXIT_OK


def _fail(message: str) -> int:
    print(f"substrate-gpu replay: error: {message}", file=sys.stderr)
    return EXIT_FAILED


def starts_with_log_header(path: Path) -> bool:
    """Whether the file's first line is an event-log header (whatever its version)."""
    from substrate_gpu.eventlog import format  # noqa: PLC0415

    try:
        with path.open("rb") as file:
            first = file.readline(_HEADER_PEEK_BYTES)
        data = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == format.FORMAT


def _actor_ids(contents: reader.LogContents) -> list[str]:
    ids = {r.actor_id for r in contents.records}
    if contents.snapshot is not None:
        ids.update(view.actor_id for view in contents.snapshot.actors)
    return sorted(ids)


def _unknown_actor(path: Path, actor: str, known: list[str]) -> str:
    message = f"no actor {actor!r} in {path}"
    if not known:
        return f"{message}: the log has no actor"
    import difflib  # noqa: PLC0415 - only on a misspelt name

    closest = difflib.get_close_matches(actor, known, n=5, cutoff=0.7)
    if closest:
        return f"{message}; did you mean {', '.join(sorted(closest))}?"
    shown = ", ".join(known[:10]) + (", …" if len(known) > 10 else "")
    return f"{message}; its {len(known)} actor(s): {shown}"


@dataclasses.dataclass(frozen=True)
class _Entry:
    record: format.Record
    transition: hooks.Transition | None


def _timelines(
    contents: reader.LogContents, result: eventlog.ReplayResult, actor: str | None
) -> dict[str, list[_Entry]]:
    """Each actor's records paired with the transitions replay produced, in log order."""
    from substrate_gpu.lifecycle import events  # noqa: PLC0415

    transitions: Iterator[hooks.Transition] = iter(result.transitions)
    out: dict[str, list[_Entry]] = {a: [] for a in sorted(result.actors)}
    for record in contents.records:
        if actor is not None and record.actor_id != actor:
            continue
        t = next(transitions) if isinstance(record, events.Event) else None
        out.setdefault(record.actor_id, []).append(_Entry(record, t))
    return out


def _when(at: float) -> str:
    """``at`` as an ISO time; the raw number when no calendar can show it."""
    try:
        moment = datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        # Agents before the request check accepted any finite 'at' (-1e300): show it as is.
        return repr(at)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _warn_unshowable_times(path: Path, contents: reader.LogContents) -> None:
    """One warning per record whose time :func:`_when` cannot show as a date."""
    from substrate_gpu.eventlog import format  # noqa: PLC0415

    for record in contents.records:
        event = record.event if isinstance(record, format.Rejection) else record
        if _when(event.at) != repr(event.at):
            continue
        where = f"seq {event.seq}" if event.seq else f"a refused {event.type!r}"
        print(
            f"substrate-gpu replay: warning: {path}: {where} of actor {event.actor_id!r}: "
            f"'at' {event.at!r} is not a time a calendar can show; shown as the raw number",
            file=sys.stderr,
        )


def _print_text(
    out: TextIO, result: eventlog.ReplayResult, timelines: dict[str, list[_Entry]]
) -> None:
    from substrate_gpu.eventlog import format  # noqa: PLC0415

    since = f" after the snapshot at seq {result.snapshot_seq}" if result.snapshot_seq else ""
    out.write(
        f"{result.path}: {result.events_replayed} event(s) replayed{since}, "
        f"{len(result.rejections)} refusal(s), last seq {result.last_seq}, "
        f"{len(timelines)} actor(s)\n"
    )
    for actor_id, entries in timelines.items():
        out.write(f"\nactor {actor_id}\n")
        for entry in entries:
            record = entry.record
            if isinstance(record, format.Rejection):
                event = record.event
                out.write(
                    f"  {'-':>8}  {_when(event.at)}  {event.type:<20} REFUSED in "
                    f"{record.state}: {record.problem}\n"
                )
                continue
            t = entry.transition
            assert t is not None
            reason = f"  ({t.reason})" if t.reason else ""
            out.write(
                f"  {record.seq:>8}  {_when(t.at)}  {t.event_type:<20} {t.source} -> {t.dest}"
                f"{reason}\n"
            )
        view = result.actors.get(actor_id)
        if view is None:
            out.write("  final: not known (only refused events)\n")
            continue
        details = [
            "gpu" if view.gpu else "cpu",
            f"checkpoint {view.checkpoint}" if view.checkpoint else "no checkpoint",
        ]
        if view.live_contexts:
            details.append(f"{view.live_contexts} live CUDA context(s)")
        if view.reason:
            details.append(f"reason: {view.reason}")
        out.write(f"  final: {view.state} ({', '.join(details)})\n")


_NAME_LISTS = ("gpu_names", "gpu_devices")
"""View fields held as comma-separated names (CDI names have no comma): lists in JSON."""
_PID_LISTS = ("cuda_pids", "checkpoint_cuda_pids", "context_pids")
"""View fields held as comma-separated pids: lists of numbers in JSON."""


def _final(view: msgspec.Struct) -> dict[str, object]:
    """The final view as JSON wants it: the joined fields as the lists they stand for."""
    import msgspec  # noqa: PLC0415

    final: dict[str, object] = msgspec.structs.asdict(view)
    for name in _NAME_LISTS:
        text = getattr(view, name)
        final[name] = text.split(",") if text else []
    for name in _PID_LISTS:
        text = getattr(view, name)
        final[name] = [int(pid) for pid in text.split(",") if pid]
    return final


def _document(
    result: eventlog.ReplayResult, timelines: dict[str, list[_Entry]]
) -> dict[str, object]:

    from substrate_gpu.eventlog import format  # noqa: PLC0415

    torn = result.torn_tail
    actors: dict[str, object] = {}
    for actor_id, entries in timelines.items():
        timeline: list[dict[str, object]] = []
        for entry in entries:
            record = entry.record
            if isinstance(record, format.Rejection):
                timeline.append(
                    {
                        "refused": True,
                        "at": record.event.at,
                        "event": record.event.type,
                        "state": record.state,
                        "problem": record.problem,
                    }
                )
            else:
                t = entry.transition
                assert t is not None
                timeline.append(
                    {
                        "seq": record.seq,
                        "at": t.at,
                        "event": t.event_type,
                        "from": t.source,
                        "to": t.dest,
                        "reason": t.reason,
                    }
                )
        view = result.actors.get(actor_id)
        actors[actor_id] = {
            "final": _final(view) if view is not None else None,
            "timeline": timeline,
        }
    return {
        "log": str(result.path),
        "events_replayed": result.events_replayed,
        "refusals": len(result.rejections),
        "last_seq": result.last_seq,
        "snapshot_seq": result.snapshot_seq,
        "torn_tail": dataclasses.asdict(torn) if torn is not None else None,
        "actors": actors,
    }
