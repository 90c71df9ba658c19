"""Reading an event log: header, snapshot, records, and the torn tail a crash may leave.

Framing is by newline. Every complete line (ending in ``\\n``) must parse, or the log is
corrupt (:class:`CorruptLogError` naming the line). A last line *without* its newline was
being written when the agent died; it never reached its fsync, so it was never acknowledged
and no effect acted on it. It is dropped, never parsed (a cut line can be valid JSON that
says something else), and reported as :class:`TornTail` (byte offset and size).

Parsing speed matters (recovery reads the whole segment): the file is read a few MiB at a
time into one buffer, and each piece's complete lines are decoded in one call (msgspec's
newline-delimited decoding into the record union, see :mod:`substrate_gpu.eventlog.format`).
The result is only trusted when it decodes and gives exactly one record per line; otherwise
the lines are decoded a chunk at a time and a bad chunk line by line, which names the bad
line (blank lines, two values on one line and every schema error are found this way).
"""

from __future__ import annotations

import contextlib
import gc
import io
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu.eventlog import errors, format, snapshot
from substrate_gpu.lifecycle import errors as lifecycle_errors
from substrate_gpu.lifecycle import events

_CHUNK_BYTES = 256 << 10
_READ_BYTES = 4 << 20


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
    """Read the log at ``path`` (see the module doc); :class:`EventLogError` when unreadable.

    Read a few MiB at a time into one reused buffer, each piece's complete lines decoded
    as it comes: holding the whole file (hundreds of MiB for a long log) cost a page fault
    per 4 KiB on top of the decoded records, a tenth of a million-event replay."""
    try:
        with path.open("rb", buffering=0) as f, gc_paused():
            return _read_stream(path, f)
    except FileNotFoundError as e:
        raise errors.EventLogError(f"no event log at {path}") from e
    except OSError as e:
        raise errors.EventLogError(f"cannot read event log {path}: {e.strerror or e}") from e


def _read_stream(path: Path, f: io.RawIOBase) -> LogContents:
    buffer = bytearray(_READ_BYTES)
    view = memoryview(buffer)
    offset = 0  # of buffer[0] in the file
    kept = 0  # bytes of an unfinished line at the start of the buffer
    header: format.Header | None = None
    base = None
    records: list[format.Record] = []
    while True:
        if kept == len(buffer):  # one line longer than the buffer: make room
            view.release()
            buffer += bytes(len(buffer))
            view = memoryview(buffer)
        got = f.readinto(view[kept:]) or 0
        if got == 0:
            break
        filled = kept + got
        end = buffer.rfind(b"\n", 0, filled) + 1  # complete lines end here
        start = 0
        if end and header is None:
            start = buffer.index(b"\n") + 1
            try:
                header = format.decode_header(bytes(buffer[: start - 1]))
            except ValueError as e:
                raise errors.CorruptLogError(path, 1, str(e)) from e
            if header.snapshot is not None:
                base = snapshot.read(path.with_name(header.snapshot), seq=header.base_seq)
        if start < end:
            records += _all_records(path, buffer, view[start:end], start, number=len(records) + 2)
        offset += end
        kept = filled - end
        buffer[:kept] = buffer[end:filled]
    # What follows the last newline was torn (being written when the agent died).
    line = len(records) + 2 if header is not None else 1
    torn = TornTail(offset=offset, size=kept, line=line) if kept else None
    if header is None:
        # Even the header was torn (the log was being created): an empty log.
        return LogContents(path, format.Header(v=format.VERSION), None, [], torn, 0)
    _check_order(path, records, header.base_seq)
    return LogContents(path, header, base, records, torn, offset)


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


def _all_records(
    path: Path, data: bytearray, lines: memoryview, start: int, *, number: int
) -> list[format.Record]:
    """Every record of ``lines``, complete lines at ``data[start:]``, the first being line
    ``number``: one msgspec call when they are sound (no copy, no per-line work); by chunks,
    then lines, to name the bad line when they are not."""
    end = start + len(lines)
    try:
        records = format.RECORD.decode_lines(lines)
    except lifecycle_errors.EventSchemaError:
        records = []
    if records and _one_object_per_line(data, start, end, len(records)):
        return records
    return list(_records(path, data, start, end, number))


def _one_object_per_line(data: bytearray, start: int, end: int, values: int) -> bool:
    """``data[start:end]`` (complete lines) holds exactly one JSON object per line, given
    that it decoded to ``values`` values.

    msgspec skips blank lines and reads two values on one line, so this is checked: the
    first line starts with ``{``, the last ends with ``}``, and ``}\n{`` joins every pair of
    neighbours. A blank line breaks two joins while carrying no value, and a line with two
    values adds a value and no join, so ``values - 1`` joins hold only for a sound log (a
    JSON string cannot hold a raw newline). Counting a 3-byte needle is about three times
    cheaper than counting newlines."""
    return (
        data[start] == _OPEN
        and data[end - 2] == _CLOSE
        and data.count(b"}\n{", start, end) == values - 1
    )


_OPEN, _CLOSE = ord("{"), ord("}")


def _records(
    path: Path, data: bytearray, start: int, end: int, number: int
) -> Iterator[format.Record]:
    """The records of the complete lines in ``data[start:end]`` (line ``number`` starts at
    ``start``)."""
    decode_lines = format.RECORD.decode_lines
    while start < end:
        stop = data.find(b"\n", min(start + _CHUNK_BYTES, end - 1))
        block = bytes(data[start:stop])  # whole lines, without the last newline
        count = block.count(b"\n") + 1
        try:
            parsed = decode_lines(block)
        except lifecycle_errors.EventSchemaError:
            parsed = []
        if len(parsed) != count or not _one_object_per_line(data, start, stop + 1, count):
            # A bad line, a blank one, or two values on one line: find it, and name it.
            parsed = [
                _parse_line(path, number + i, line) for i, line in enumerate(block.split(b"\n"))
            ]
        yield from parsed
        number += count
        start = stop + 1


def _parse_line(path: Path, number: int, line: bytes) -> format.Record:
    try:
        return format.RECORD.decode(line)
    except lifecycle_errors.EventSchemaError as e:
        raise errors.CorruptLogError(path, number, str(e)) from e


def _check_order(path: Path, records: list[format.Record], base_seq: int) -> None:
    try:
        seqs = [r.seq for r in records]  # type: ignore[union-attr]
    except AttributeError:  # a rejection (they carry no seq): the rare case
        rejection = format.Rejection
        seqs = [r.seq for r in records if r.__class__ is not rejection]  # type: ignore[union-attr]
    if all(map(operator.lt, [base_seq, *seqs], seqs)):
        return  # the common case, checked in C; otherwise find the line below
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
