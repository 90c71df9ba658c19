"""configure_logging and bind_actor: one JSON shape for structlog and stdlib, no locals leaked."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from substrate_gpu.observability import bind_actor, configure_logging

pytestmark = pytest.mark.usefixtures("restore_logging")

SECRET = "hunter2-s3cr3t-token"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line]


def test_json_lines_parse_and_carry_the_standard_fields() -> None:
    """Each structlog call is one JSON object with timestamp, level, logger and event."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    structlog.get_logger("substrate_gpu.test").info("sandbox created", nvproxy=True)
    (line,) = _lines(out)
    assert line["event"] == "sandbox created"
    assert line["level"] == "info"
    assert line["logger"] == "substrate_gpu.test"
    assert line["nvproxy"] is True
    assert isinstance(line["timestamp"], str)
    assert line["timestamp"].endswith("Z")


def test_bind_actor_adds_actor_id_and_event_type_inside_only() -> None:
    """Lines inside bind_actor carry actor_id and event_type; lines after it do not."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    log = structlog.get_logger("substrate_gpu.test")
    with bind_actor("actor-42", "suspend_requested"):
        log.info("probing")
    log.info("after")
    inside, after = _lines(out)
    assert inside["actor_id"] == "actor-42"
    assert inside["event_type"] == "suspend_requested"
    assert inside["event"] == "probing"
    assert "actor_id" not in after
    assert "event_type" not in after


def test_stdlib_records_come_out_in_the_same_json_shape() -> None:
    """A stdlib logger's line has the same keys as a structlog one, context included."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    with bind_actor("actor-9", "run_requested"):
        structlog.get_logger("substrate_gpu.test").info("from structlog")
        logging.getLogger("anyio.test").info("from %s", "stdlib")
    ours, theirs = _lines(out)
    assert theirs["event"] == "from stdlib"
    assert theirs["logger"] == "anyio.test"
    assert theirs["actor_id"] == "actor-9"
    assert set(theirs) == set(ours)


def test_transitions_logger_is_quiet_below_warning() -> None:
    """transitions' per-trigger INFO chatter is dropped; its warnings still come through."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    logging.getLogger("transitions.core").info("Executed callback")
    logging.getLogger("transitions.core").warning("Callback failed")
    assert [line["event"] for line in _lines(out)] == ["Callback failed"]


def test_level_filters_structlog_and_stdlib_alike() -> None:
    """At WARNING, info lines from both worlds are dropped."""
    out = io.StringIO()
    configure_logging(json=True, level="WARNING", stream=out)
    structlog.get_logger("x").info("dropped")
    logging.getLogger("y").info("dropped")
    structlog.get_logger("x").warning("kept")
    assert [line["event"] for line in _lines(out)] == ["kept"]


def _fail_with_a_secret_local() -> None:
    token = SECRET
    raise RuntimeError(f"while talking to runsc: exit status {len(token) % 7}")


@pytest.mark.parametrize("source", ["structlog", "stdlib"])
def test_tracebacks_are_dicts_without_local_variables(source: str) -> None:
    """An exception's structured traceback has frames but no local values (no leaked secret)."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    try:
        _fail_with_a_secret_local()
    except RuntimeError:
        if source == "structlog":
            structlog.get_logger("substrate_gpu.test").exception("effect failed")
        else:
            logging.getLogger("substrate_gpu.stdlib").exception("effect failed")
    assert SECRET not in out.getvalue()
    (line,) = _lines(out)
    traces = line["exception"]
    assert isinstance(traces, list)
    (trace,) = traces
    assert trace["exc_type"] == "RuntimeError"
    frames = trace["frames"]
    assert any(f["name"] == "_fail_with_a_secret_local" for f in frames)
    assert all(not f.get("locals") for f in frames)


def test_console_renderer_on_a_tty_without_local_variables() -> None:
    """json=None on a TTY renders for humans; its traceback shows no locals either."""
    out = _Tty()
    configure_logging(stream=out)
    with bind_actor("actor-1"):
        try:
            _fail_with_a_secret_local()
        except RuntimeError:
            structlog.get_logger("substrate_gpu.test").exception("effect failed")
    text = out.getvalue()
    assert "effect failed" in text
    assert "actor-1" in text
    assert "Traceback" in text
    assert SECRET not in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_json_is_the_default_when_not_a_tty() -> None:
    """json=None on a pipe or file renders JSON lines."""
    out = io.StringIO()
    configure_logging(stream=out)
    structlog.get_logger("x").info("hello")
    assert _lines(out)[0]["event"] == "hello"


def test_configuring_twice_replaces_the_handler() -> None:
    """A second configure_logging writes to the new stream only, once per record."""
    first, second = io.StringIO(), io.StringIO()
    configure_logging(json=True, stream=first)
    configure_logging(json=True, stream=second)
    logging.getLogger("z").warning("once")
    assert first.getvalue() == ""
    assert [line["event"] for line in _lines(second)] == ["once"]
