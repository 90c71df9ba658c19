"""Reading an event log: header, snapshot, records, and the torn tail a crash may leave.

Framing is by newline. Every complete line (ending in ``\\n``) must parse, or the log is
corrupt (:class:`CorruptLogError` naming the line). A last line *without* its newline was
being written when the agent died; it never reached its fsync, so it was never acknowledged
and no effect acted on it. It is dropped, never parsed (a cut line can be valid JSON that
says something else), and reported as :class:`TornTail` (byte offset and size).

Parsing speed matters (recovery reads the whole segment): lines are parsed a chunk at a
time with one ``json.loads`` of ``[line,line,...]``. A chunk is only trusted when every
line is framed as one object (starts with ``{``, ends with ``}``) and the array has exactly
one element per line; otherwise the chunk is parsed line by line, which finds the bad line.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu.eventlog import errors, format, snapshot
from substrate_gpu.lifecycle import errors as lifecycle_errors
from substrate_gpu.lifecycle import events

_CHUNK_BYTES = 256 << 10


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
    """Read the log at ``path`` (see the module doc); :class:`EventLogError` when unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise errors.EventLogError(f"no event log at {path}") from e
    except OSError as e:
        raise errors.EventLogError(f"cannot read event log {path}: {e.strerror or e}") from e
    return parse_log(path, data)


def parse_log(path: Path, data: bytes) -> LogContents:
    """Parse the bytes of the log at ``path``."""
    end = data.rfind(b"\n") + 1  # complete lines end here; what follows was torn
    torn = None
    if end < len(data):
        line = data.count(b"\n", 0, end) + 1
        torn = TornTail(offset=end, size=len(data) - end, line=line)
    if end == 0:
        # Even the header was torn (the log was being created): an empty log.
        return LogContents(path, format.Header(v=format.VERSION), None, [], torn, 0)
    first = data.index(b"\n") + 1
    try:
        header = format.parse_header(json.loads(data[: first - 1]))
    except ValueError as e:
        raise errors.CorruptLogError(path, 1, str(e)) from e
    base = None
    if header.snapshot is not None:
        base = snapshot.read(path.with_name(header.snapshot), seq=header.base_seq)
    with gc_paused():
        records = list(_records(path, data, first, end))
    _check_order(path, records, header.base_seq)
    return LogContents(path, header, base, records, torn, end)


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


def _records(path: Path, data: bytes, start: int, end: int) -> Iterator[format.Record]:
    """The records of the complete lines in ``data[start:end]`` (line 2 starts at ``start``)."""
    fast = format.fast_decoders()
    decode_record = format.decode_record
    number = 2
    while start < end:
        stop = data.find(b"\n", min(start + _CHUNK_BYTES, end - 1))
        block = data[start:stop]  # whole lines, without the last newline
        count = block.count(b"\n") + 1
        parsed = _parse_block(block, count)
        if parsed is None:
            lines = block.split(b"\n")
            parsed = [_parse_line(path, number + i, line) for i, line in enumerate(lines)]
        for i, item in enumerate(parsed):
            decode = fast.get(item.get("type"))  # type: ignore[call-overload]
            try:
                record = decode(item) if decode is not None else None
                if record is None:
                    record = decode_record(item)
            except (ValueError, lifecycle_errors.EventSchemaError) as e:
                raise errors.CorruptLogError(path, number + i, str(e)) from e
            yield record
        number += count
        start = stop + 1


def _parse_block(block: bytes, count: int) -> list[dict[str, object]] | None:
    """The ``count`` objects of ``block`` parsed at once, or None to go line by line.

    JSON never holds a raw newline inside a value, so ``block`` with its newlines turned
    into commas is the array of its lines. It is only trusted when every line is framed as
    one object (``{`` first, ``}`` last) and the array has exactly one element per line.
    """
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


def _parse_line(path: Path, number: int, line: bytes) -> dict[str, object]:
    try:
        data = json.loads(line)
    except ValueError as e:
        raise errors.CorruptLogError(path, number, f"not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise errors.CorruptLogError(
            path, number, f"a record must be a JSON object, got {type(data).__name__}"
        )
    return data


def _check_order(path: Path, records: list[format.Record], base_seq: int) -> None:
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
