"""substrate_gpu._log: structlog imported, and logging configured, only when a record is logged."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from substrate_gpu import _log


@pytest.fixture(autouse=True)
def _no_pending_configuration() -> Iterator[None]:
    yield
    _log.configure_on_first_log(None)


def _run(code: str) -> dict[str, object]:
    """``code`` in a fresh interpreter; it leaves its findings in a dict ``out``."""
    done = subprocess.run(
        [sys.executable, "-c", f"out = {{}}\n{code}\nimport json\nprint(json.dumps(out))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_getting_and_binding_a_logger_imports_no_structlog() -> None:
    """A module-level logger and a bound one cost nothing until something is logged."""
    out = _run(
        "import sys\nfrom substrate_gpu import _log\n"
        "log = _log.get_logger('m').bind(bundle='/b')\n"
        "out['structlog'] = 'structlog' in sys.modules"
    )
    assert out == {"structlog": False}


def test_records_below_the_pending_level_are_dropped_without_configuring() -> None:
    """At a pending WARNING, ``info`` runs no configuration and imports no structlog."""
    out = _run(
        "import sys\nfrom substrate_gpu import _log\n"
        "out['configured'] = 0\n"
        "def configure(): out['configured'] += 1\n"
        "_log.configure_on_first_log(configure, level='WARNING')\n"
        "_log.get_logger('m').bind(a=1).info('quiet', b=2)\n"
        "out['structlog'] = 'structlog' in sys.modules"
    )
    assert out == {"configured": 0, "structlog": False}


def test_the_first_record_at_the_level_configures_once() -> None:
    """The configuration runs before the first record it would let through, and only once."""
    out = _run(
        "from substrate_gpu import _log\n"
        "out['configured'] = 0\n"
        "def configure(): out['configured'] += 1\n"
        "_log.configure_on_first_log(configure, level='WARNING')\n"
        "log = _log.get_logger('m')\n"
        "log.warning('first')\nlog.bind(a=1).error('second')\nlog.info('third')"
    )
    assert out == {"configured": 1}


def test_a_bound_logger_logs_through_structlog_with_its_context() -> None:
    """Records reach structlog with the logger's bound context, and follow its configuration
    (here: structlog's own capture)."""
    log = _log.get_logger("substrate_gpu.test").bind(bundle="/b")
    with capture_logs() as records:
        log.bind(actor="a1").warning("gpu_injected", devices=2)
        log.debug("detail")
    assert records == [
        {
            "bundle": "/b",
            "actor": "a1",
            "devices": 2,
            "event": "gpu_injected",
            "log_level": "warning",
        },
        {"bundle": "/b", "event": "detail", "log_level": "debug"},
    ]


def test_a_forgotten_configuration_does_not_run() -> None:
    """``configure_on_first_log(None)`` (the CLI's, once its command returns) forgets it."""
    ran: list[int] = []
    _log.configure_on_first_log(lambda: ran.append(1), level="DEBUG")
    _log.configure_on_first_log(None)
    with capture_logs():
        _log.get_logger("substrate_gpu.test").warning("later")
    assert ran == []
