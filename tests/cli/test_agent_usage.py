"""``substrate-gpu agent`` command-line mistakes."""

from __future__ import annotations

import pytest

from substrate_gpu import cli


def test_agent_without_any_input_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Neither --socket, --worker-socket nor --stdin: exit 2 with the agent's usage."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["agent", "--metrics-port", "0"])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage: substrate-gpu agent" in err
    assert "no input: give --socket PATH, --worker-socket PATH and/or --stdin" in err
