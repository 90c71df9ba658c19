"""Reading an event log: header, snapshot, records, and the torn tail a crash may leave.

Framing is by newline. Every complete line (ending in ``\\n``) must parse, or the log is
corrupt (:class:`CorruptLogError` naming the line). A last line *without* its newline was
being written when the agent died; it never reached its fsync, so it was never acknowledged
and no effect acted on it. It is dropped, never parsed (a cut line can be valid JSON that
says something else), and reported as :class:`TornTail` (byte offset and size).

Parsing speed matters (recovery reads the whole segment): the file is read whole and its
complete lines decoded in one call (msgspec's newline-delimited decoding into the record
union, see :mod:`substrate_gpu.eventlog.format`). The result is only trusted when it gives
exactly one record per line; otherwise the lines are decoded one by one, which names the
bad line (blank lines, two values on one line and every schema error are found this way).
"""

from __future__ import annotations

import contextlib
import gc
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu.eventlog import errors, format, snapshot
from substrate_gpu.lifecycle import errors as lifecycle_errors
from substrate_gpu.lifecycle import events


@dataclass(frozen=True)
class TornTail:
    """The incomplete last line a crash left (dropped)."""

    offset: int
    """Byte offset where it starts (the log's valid content ends here)."""
    size: int
    """Its length in bytes."""
    line: int
    """Its line number (1-based)."""

    def describe(self) -> str:
        """One human sentence."""
        return (
            f"torn last line {self.line} ({self.size} bytes at offset {self.offset}) dropped: "
            "the agent stopped while writing it, before it was acknowledged"
        )


@dataclass(frozen=True)
class LogContents:
    """Everything a log holds."""

    path: Path
    """The log file."""
    header: format.Header
    """Its header (a fresh default when the header line itself was torn)."""
    snapshot: snapshot.Snapshot | None
    """The snapshot the segment continues, or None."""
    records: list[format.Record]
    """Accepted events and rejections, in log order (record ``i`` is on line ``i + 2``)."""
    torn_tail: TornTail | None
    """The dropped incomplete last line, if any."""
    valid_bytes: int
    """Bytes of complete lines (the writer truncates the file to this before appending)."""
    missing: tuple[tuple[int, int], ...] = ()
    """Seq ranges (first, last; inclusive) absent between the segment's base and its last
    event. Seqs are handed out one by one and every accepted event is logged, so a gap is a
    line taken out of the middle (an edit, a bad copy), or the tail an earlier start found
    lost (:mod:`.seqmark`): never a crash, which can only tear the last line."""

    def describe_missing(self) -> str:
        """The missing seqs as one phrase (``seq 5``, ``seqs 7 to 9, 12``); empty if none."""
        parts = [str(a) if a == b else f"{a} to {b}" for a, b in self.missing]
        count = sum(b - a + 1 for a, b in self.missing)
        if not parts:
            return ""
        return f"seq{'s' if count > 1 else ''} {', '.join(parts)}"

    @property
    def events(self) -> list[events.Event]:
        """The accepted events, in order."""
        return [r for r in self.records if isinstance(r, events.Event)]

    @property
    def rejections(self) -> list[format.Rejection]:
        """The recorded refusals, in order."""
        return [r for r in self.records if isinstance(r, format.Rejection)]

    @property
    def last_seq(self) -> int:
        """The seq of the last accepted event (or of the snapshot; 0 for an empty log)."""
        for record in reversed(self.records):
            if isinstance(record, events.Event):
                return record.seq
        return self.header.base_seq

    @staticmethod
    def line_of(index: int) -> int:
        """The line number of ``records[index]``."""
        return index + 2


def read_log(path: Path) -> LogContents:
    """Read the log at ``path`` (see the module doc); :class:`EventLogError` when unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise errors.EventLogError(f"no event log at {path}") from e
    except OSError as e:
        raise errors.EventLogError(f"cannot read event log {path}: {e.strerror or e}") from e
    with gc_paused():
        return _parse(path, data)


def _parse(path: Path, data: bytes) -> LogContents:
    end = data.rfind(b"\n") + 1  # complete lines end here; what follows was torn
    if end == 0:
        # Even the header was torn (the log was being created): an empty log.
        torn = TornTail(offset=0, size=len(data), line=1) if data else None
        return LogContents(path, format.Header(v=format.VERSION), None, [], torn, 0)
    start = data.index(b"\n") + 1
    try:
        header = format.decode_header(data[: start - 1])
    except ValueError as e:
        raise errors.CorruptLogError(path, 1, str(e)) from e
    base = None
    if header.snapshot is not None:
        base = snapshot.read(path.with_name(header.snapshot), seq=header.base_seq)
    records = _records(path, data, start, end) if start < end else []
    torn = TornTail(offset=end, size=len(data) - end, line=len(records) + 2)
    missing = _check_order(path, records, header.base_seq)
    return LogContents(path, header, base, records, torn if end < len(data) else None, end, missing)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: parsing and replay allocate millions of small objects that all
    stay alive and form no cycle; the GC would rescan them again and again for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _records(path: Path, data: bytes, start: int, end: int) -> list[format.Record]:
    """Every record of the complete lines ``data[start:end]`` (the first being line 2): one
    msgspec call when they are sound (through a memoryview: no copy of the file); line by
    line, naming the first bad one, when they are not."""
    try:
        records = format.RECORD.decode_lines(memoryview(data)[start:end])
    except lifecycle_errors.EventSchemaError:
        records = []
    if records and _one_object_per_line(data, start, end, len(records)):
        return records
    return [
        _parse_line(path, number, line)
        for number, line in enumerate(data[start : end - 1].split(b"\n"), start=2)
    ]


def _one_object_per_line(data: bytes, start: int, end: int, values: int) -> bool:
    """``data[start:end]`` (complete lines) holds exactly one JSON object per line, given
    that it decoded to ``values`` values.

    msgspec skips blank lines and reads two values on one line, so this is checked: the
    first line starts with ``{``, the last ends with ``}``, and ``}\n{`` joins every pair of
    neighbours. Then every line starts a value, and ``values - 1`` joins mean as many lines
    as values (a JSON string cannot hold a raw newline). Counting newlines instead would
    let a blank line and a line with two values cancel out."""
    return (
        data[start] == _OPEN
        and data[end - 2] == _CLOSE
        and data.count(b"}\n{", start, end) == values - 1
    )


_OPEN, _CLOSE = ord("{"), ord("}")


def _parse_line(path: Path, number: int, line: bytes) -> format.Record:
    try:
        return format.RECORD.decode(line)
    except lifecycle_errors.EventSchemaError as e:
        raise errors.CorruptLogError(path, number, str(e)) from e


def _check_order(
    path: Path, records: list[format.Record], base_seq: int
) -> tuple[tuple[int, int], ...]:
    """Raise unless the events' seqs rise strictly from ``base_seq``; the ranges missing."""
    try:
        seqs = [r.seq for r in records]  # type: ignore[union-attr]
    except AttributeError:  # a rejection (they carry no seq): the rare case
        rejection = format.Rejection
        seqs = [r.seq for r in records if r.__class__ is not rejection]  # type: ignore[union-attr]
    if all(map(operator.lt, [base_seq, *seqs], seqs)):
        # The common case, checked in C. Rising strictly, they are contiguous exactly when
        # the last is as far above the base as there are events.
        if not seqs or seqs[-1] - base_seq == len(seqs):
            return ()
        return tuple(
            (before + 1, after - 1)
            for before, after in zip([base_seq, *seqs], seqs, strict=False)
            if after > before + 1
        )
    last = base_seq
    event_type = events.Event
    for i, record in enumerate(records):
        if isinstance(record, event_type):
            if record.seq <= last:
                raise errors.CorruptLogError(
                    path,
                    i + 2,
                    f"event seq {record.seq} does not follow seq {last} (the log's order is "
                    "its seq order)",
                )
            last = record.seq
    raise AssertionError("unreachable: the seqs do not rise, so the loop raised")
