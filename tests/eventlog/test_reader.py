"""Reading logs: framing, the torn last line, corruption named by line, headers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import structlog.testing

from eventlog import logs
from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, read_log
from substrate_gpu.lifecycle import events

pytestmark = pytest.mark.anyio


def _good(path: Path) -> list[str]:
    lines = [logs.header(), logs.registered("a", 1), logs.registered("b", 2)]
    logs.write_lines(path, *lines)
    return lines


def test_a_log_reads_back_its_events_in_order(log_path: Path) -> None:
    """Every complete line is an event, in seq order; no torn tail."""
    _good(log_path)
    contents = read_log(log_path)
    assert [e.actor_id for e in contents.events] == ["a", "b"]
    assert contents.last_seq == 2
    assert contents.torn_tail is None
    assert contents.valid_bytes == log_path.stat().st_size


@pytest.mark.parametrize(
    "cut", [1, 10, 40, -1], ids=["one-byte", "mid-key", "mid-value", "all-but-newline"]
)
def test_a_torn_last_line_is_dropped_and_reported_never_parsed(log_path: Path, cut: int) -> None:
    """Whatever prefix of the last line survived (even a complete JSON object without its
    newline), it is dropped and reported by offset and size."""
    lines = _good(log_path)
    torn_line = logs.registered("c", 3)
    kept = torn_line[:cut] if cut > 0 else torn_line
    logs.write_lines(log_path, *lines, tail=kept)
    contents = read_log(log_path)
    assert [e.actor_id for e in contents.events] == ["a", "b"]
    offset = sum(len(line) + 1 for line in lines)
    assert contents.torn_tail == eventlog.TornTail(offset=offset, size=len(kept), line=4)
    assert contents.valid_bytes == offset
    assert "dropped" in contents.torn_tail.describe()


def test_a_torn_header_reads_as_an_empty_log(log_path: Path) -> None:
    """A crash while the log was created: nothing was logged."""
    logs.write_lines(log_path, tail=logs.header()[:12])
    contents = read_log(log_path)
    assert contents.records == []
    assert contents.torn_tail is not None and contents.torn_tail.offset == 0


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        pytest.param("{not json", "not valid JSON", id="garbage"),
        pytest.param("", "not valid JSON", id="blank-line"),
        pytest.param("[1, 2]", "must be a JSON object", id="not-an-object"),
        pytest.param(
            '{"type":"teleported","v":1,"actor_id":"a","seq":3}',
            "unknown event type",
            id="unknown-type",
        ),
        pytest.param(
            '{"type":"run_requested","v":9,"actor_id":"a","seq":3,"at":1.0}',
            "schema version 9",
            id="newer-event-version",
        ),
        pytest.param(
            '{"type":"run_requested","v":1,"actor_id":"a","seq":"3","at":1.0}',
            "Expected `int`, got `str` - at `$.seq`",
            id="wrong-field-type",
        ),
        pytest.param(
            '{"type":"run_requested","v":1,"actor_id":"a","seq":1,"at":1.0}',
            "does not follow seq 1",
            id="seq-not-increasing",
        ),
        pytest.param(
            '{"type":"run_requested","v":1,"actor_id":"a","seq":3,"at":1.0},{"x":1}',
            "not valid JSON",
            id="two-objects",
        ),
        pytest.param(
            '{"type":"rejected","v":1,"event":{"type":"run_requested","v":1,"actor_id":"a"},"state":3,"problem":"p"}',
            "Expected `str`, got `int` - at `$.state`",
            id="bad-rejection",
        ),
    ],
)
def test_a_corrupt_middle_line_is_an_error_naming_its_line(
    log_path: Path, bad: str, problem: str
) -> None:
    """A complete line that cannot be read stops the reader at that line number."""
    lines = _good(log_path)
    logs.write_lines(log_path, *lines[:2], bad, *lines[2:])
    with pytest.raises(eventlog.CorruptLogError, match=re.escape(problem)) as info:
        read_log(log_path)
    assert info.value.line == 3
    assert f"{log_path}:3" in str(info.value)


def test_two_objects_on_a_line_and_a_blank_line_do_not_cancel_out(log_path: Path) -> None:
    """As many values as lines is not enough: a line holding two records and a blank line
    elsewhere are still found (the first of them is named)."""
    header, first, second = _good(log_path)
    third = logs.registered("c", 3)
    logs.write_lines(log_path, header, first + second, "", third)
    with pytest.raises(eventlog.CorruptLogError) as info:
        read_log(log_path)
    assert info.value.line == 2


def test_corruption_deep_in_a_big_log_names_the_right_line(log_path: Path) -> None:
    """The one-call decoder falls back to per-line parsing to find the bad line."""
    lines = [logs.header(), *(logs.registered(f"a{i}", i + 1) for i in range(5000))]
    lines[4321] = lines[4321][:-3]
    logs.write_lines(log_path, *lines)
    with pytest.raises(eventlog.CorruptLogError) as info:
        read_log(log_path)
    assert info.value.line == 4322


@pytest.mark.parametrize(
    ("first", "problem"),
    [
        pytest.param(
            '{"format":"something-else","v":1}',
            "not a substrate-gpu-eventlog header",
            id="other-format",
        ),
        pytest.param(
            '{"format":"substrate-gpu-eventlog","v":2}', "format version 2", id="newer-format"
        ),
        pytest.param(
            logs.registered("a", 1), "not a substrate-gpu-eventlog header", id="no-header"
        ),
        pytest.param(
            '{"format":"substrate-gpu-eventlog","v":1,"base_seq":5,"snapshot":null}',
            "set together",
            id="half-a-snapshot",
        ),
    ],
)
def test_a_bad_header_is_refused_on_line_1(log_path: Path, first: str, problem: str) -> None:
    """Another format or a newer version is refused, not guessed at."""
    logs.write_lines(log_path, first)
    with pytest.raises(eventlog.CorruptLogError, match=problem) as info:
        read_log(log_path)
    assert info.value.line == 1


def test_a_missing_log_is_an_event_log_error(tmp_path: Path) -> None:
    """Reading a path with no log says so."""
    with pytest.raises(eventlog.EventLogError, match="no event log at"):
        read_log(tmp_path / "nope.jsonl")


async def test_the_writer_truncates_a_torn_tail_before_appending(log_path: Path) -> None:
    """Open drops the torn bytes (reported), so the next event starts on a fresh line."""
    lines = _good(log_path)
    logs.write_lines(log_path, *lines, tail='{"type":"run_req')
    async with await EventLog.open(log_path) as log:
        assert log.torn_tail is not None and log.torn_tail.size == len('{"type":"run_req')
        assert log.last_seq == 2
        from substrate_gpu.lifecycle import events

        await log.record(events.BundlePrepared(actor_id="a", bundle="/b/a", seq=3))
    contents = read_log(log_path)
    assert contents.torn_tail is None
    assert [e.seq for e in contents.events] == [1, 2, 3]


async def test_the_writer_refuses_to_open_a_corrupt_log(log_path: Path) -> None:
    """An agent never appends after a corrupt line (it would bury it)."""
    lines = _good(log_path)
    logs.write_lines(log_path, lines[0], "garbage", lines[1])
    with pytest.raises(eventlog.CorruptLogError, match=":2"):
        await EventLog.open(log_path)


async def test_the_writer_rewrites_a_torn_header(log_path: Path) -> None:
    """A log whose creation was interrupted is created again."""
    logs.write_lines(log_path, tail='{"format":"subs')
    async with await EventLog.open(log_path) as log:
        assert log.last_seq == 0
        assert log.torn_tail is not None
    assert json.loads(log_path.read_text().splitlines()[0])["format"] == "substrate-gpu-eventlog"


def test_events_survive_a_round_trip_through_the_decoders(log_path: Path, tmp_path: Path) -> None:
    """Bytes and parsed objects decode to events equal to the originals, field for field."""
    from lifecycle.factories import make_event

    from substrate_gpu.eventlog import format
    from substrate_gpu.lifecycle import events

    for i, kind in enumerate(sorted(events.REGISTRY)):
        event = make_event(kind, "a").stamped(i + 1)
        data = json.loads(event.to_json())
        assert format.decode_event(data) == events.from_dict(data) == event
        assert format.RECORD.decode(event.to_json()) == event
    # An int where a float is expected is read as the float it means.
    data = json.loads(events.RunRequested(actor_id="a", seq=1, at=5.0).to_json())
    data["at"] = 5
    assert format.decode_event(data).at == 5.0 and isinstance(format.decode_event(data).at, float)


def test_seq_order_is_checked_across_rejection_lines(log_path: Path) -> None:
    """Rejections carry no seq: the events around one must still follow each other."""
    rejected = eventlog.Rejection(
        event=events.RunRequested(actor_id="a", at=1.0), state="registered", problem="p"
    ).to_json()
    logs.write_lines(
        log_path, logs.header(), logs.registered("a", 2), rejected, logs.registered("b", 3)
    )
    assert [r.seq for r in read_log(log_path).events] == [2, 3]
    logs.write_lines(
        log_path, logs.header(), logs.registered("a", 2), rejected, logs.registered("b", 2)
    )
    with pytest.raises(eventlog.CorruptLogError, match="does not follow seq 2") as info:
        read_log(log_path)
    assert info.value.line == 4


# --- lines missing from the middle (issue 30 item 7) ------------------------------------------


def test_a_complete_log_misses_nothing(log_path: Path) -> None:
    """Seqs 1, 2 after base 0: nothing missing."""
    _good(log_path)
    contents = read_log(log_path)
    assert (contents.missing, contents.describe_missing()) == ((), "")


@pytest.mark.parametrize(
    ("seqs", "missing", "described"),
    [
        pytest.param([1, 3, 4], ((2, 2),), "seq 2", id="one-line"),
        pytest.param([1, 5, 6, 8], ((2, 4), (7, 7)), "seqs 2 to 4, 7", id="two-gaps"),
        pytest.param([2, 3], ((1, 1),), "seq 1", id="the-first-line"),
    ],
)
def test_lines_taken_from_the_middle_are_named_by_their_seqs(
    log_path: Path, seqs: list[int], missing: tuple[tuple[int, int], ...], described: str
) -> None:
    """Seqs are handed out one by one and every accepted one is logged: a gap below the
    last event is a line taken out (never a crash, which only tears the last line)."""
    logs.write_lines(log_path, logs.header(), *(logs.registered(f"a{s}", s) for s in seqs))
    contents = read_log(log_path)
    assert contents.missing == missing
    assert contents.describe_missing() == described
    assert contents.torn_tail is None


def test_a_torn_tail_is_not_a_gap(log_path: Path) -> None:
    """The torn last line is reported as such, never as missing seqs."""
    logs.write_lines(
        log_path, logs.header(), logs.registered("a", 1), logs.registered("b", 2), tail='{"ty'
    )
    contents = read_log(log_path)
    assert contents.torn_tail is not None and contents.missing == ()


async def test_opening_a_log_with_a_line_deleted_from_the_middle_warns_naming_it(
    log_path: Path, tmp_path: Path
) -> None:
    """A real run's log with one event line deleted from the middle: the writer opens it,
    warns naming the missing seq, and appends after the last."""
    await logs.short_life(log_path, tmp_path, rotate_bytes=None)
    lines = log_path.read_text().splitlines(keepends=True)
    events_at = [i for i, line in enumerate(lines) if '"seq":' in line]
    gone = events_at[len(events_at) // 2]
    seq = json.loads(lines[gone])["seq"]
    log_path.write_text("".join(lines[:gone] + lines[gone + 1 :]))
    with structlog.testing.capture_logs() as captured:
        async with await EventLog.open(log_path, rotate_bytes=None) as log:
            last = log.last_seq
    [warning] = [e for e in captured if e["event"] == "event log is missing events"]
    assert warning["missing"] == f"seq {seq}"
    assert warning["log_level"] == "warning"
    assert last == read_log(log_path).last_seq > seq
