"""substrate_gpu._log: structlog imported, and logging configured, only when a record is logged."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


def test_a_pending_level_holds_for_a_logger_that_logged_before_it() -> None:
    """A logger that logged once while structlog was configured still drops a record below
    a configuration set later (the CLI run again in one process)."""
    out = _run(
        "import structlog\nfrom substrate_gpu import _log\n"
        "seen = []\n"
        "def keep(_, __, event): seen.append(event['event']); raise structlog.DropEvent\n"
        "structlog.configure(processors=[keep])\n"
        "log = _log.get_logger('m')\n"
        "log.info('first')\n"
        "out['configured'] = 0\n"
        "def configure(): out['configured'] += 1\n"
        "_log.configure_on_first_log(configure, level='WARNING')\n"
        "log.info('below')\n"
        "log.warning('at')\n"
        "out['seen'] = seen"
    )
    assert out == {"configured": 1, "seen": ["first", "at"]}


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


TESTS = Path(__file__).resolve().parent

#: A real injection on a simulated node (toolkit-1.20 spec from the stand-in), then a
#: warning and an error from package loggers: what an embedding program's process does.
_INJECTION = f"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
from support.gpu_nodes import generate_spec, injection_options
from substrate_gpu import cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.lifecycle import pipeline
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_
tmp = Path(tempfile.mkdtemp())
sim = node_.build_node(tmp / "node", gpus=(0,))
edits = cdi.edits_for_all(generate_spec(sim, tmp / "cdi"))
bundle = bundles.make_bundle(tmp / "b", ["true"])
from substrate_gpu.rootfs import SonameCache
report = bundle_.inject_gpu(bundle, edits, options=injection_options(sim), soname_cache=SonameCache())
assert report.outcome == "injected", report
pipeline._log.warning("a_warning", actor_id="a1")
pipeline._log.bind(actor_id="a2").error("an_error", problem="x")
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_library_user_who_never_configures_logging_gets_nothing_printed() -> None:
    """The stdlib convention: unconfigured, a real injection and the package's warnings and
    errors print nothing, on stdout (where structlog's default would write) or stderr."""
    done = _python(_INJECTION)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


def test_a_program_configuring_the_stdlib_sees_the_packages_records() -> None:
    """``logging.basicConfig`` is enough to see them, in its own format: ``event key=value``."""
    configure = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
        "format='%(name)s %(levelname)s %(message)s')\n"
    )
    done = _python(configure + _INJECTION)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    injected = [line for line in lines if " gpu_injected " in line]
    assert len(injected) == 1 and injected[0].startswith("substrate_gpu.injection.bundle INFO ")
    assert "devices=" in injected[0] and "bundle='" in injected[0]
    assert "substrate_gpu.lifecycle.pipeline WARNING a_warning actor_id='a1'" in lines
    assert "substrate_gpu.lifecycle.pipeline ERROR an_error actor_id='a2' problem='x'" in lines


def test_configure_logging_later_takes_over_the_same_loggers() -> None:
    """A logger used unconfigured follows ``configure_logging`` from its next record on."""
    out = _run(
        "import io\n"
        "from substrate_gpu.lifecycle import pipeline\n"
        "from substrate_gpu.observability.logging import configure_logging\n"
        "pipeline._log.warning('before')\n"
        "stream = io.StringIO()\n"
        "configure_logging(json=True, stream=stream)\n"
        "pipeline._log.warning('after', n=1)\n"
        "out['lines'] = stream.getvalue().splitlines()"
    )
    (line,) = out["lines"]  # type: ignore[misc]
    record = json.loads(line)
    assert record["event"] == "after" and record["n"] == 1
    assert record["logger"] == "substrate_gpu.lifecycle.pipeline"
