"""``substrate-gpu agent --runsc-flag``: global runsc flags reach the driver, in order."""

from __future__ import annotations

import argparse

import pytest

from substrate_gpu import cli, exceptions
from substrate_gpu.cli import _agent
from substrate_gpu.service import wiring


def _parse(*argv: str) -> argparse.Namespace:
    # The CLI's own parser: `agent`'s flags are added when `agent` is chosen (cli._deferred).
    return cli.build_parser().parse_args(["agent", "--stdin", *argv])


def test_runsc_flags_reach_the_driver_in_order() -> None:
    """Each --runsc-flag becomes a global flag of the production runsc driver."""
    config = _agent.config_from(
        _parse("--metrics-port=0", "--runsc-flag=--platform=systrap", "--runsc-flag=--network=none")
    )
    runtime = wiring.build_collaborators(config).runtime
    assert runtime.config.global_flags == ("--platform=systrap", "--network=none")


def test_a_positional_runsc_flag_is_refused() -> None:
    """A value that is not a flag would become runsc's subcommand: refused, naming it."""
    with pytest.raises(exceptions.ConfigError, match="'systrap' is not a flag"):
        _agent.config_from(_parse("--metrics-port=0", "--runsc-flag=systrap"))


@pytest.mark.parametrize(
    ("network", "flag"),
    [
        pytest.param("pod", "--network=host", id="pod: the worker pod's namespace"),
        pytest.param("none", "--network=none", id="none"),
    ],
)
def test_sandbox_network_becomes_runscs_network_flag(network: str, flag: str) -> None:
    config = _agent.config_from(
        _parse("--metrics-port=0", "--runsc-flag=--platform=systrap", "--sandbox-network", network)
    )
    assert config.sandbox_network == network
    runtime = wiring.build_collaborators(config).runtime
    assert runtime.config.global_flags == ("--platform=systrap", flag)


def test_sandbox_network_and_a_network_runsc_flag_are_refused_together() -> None:
    with pytest.raises(exceptions.ConfigError, match="contradicts --sandbox-network pod"):
        _agent.config_from(
            _parse("--metrics-port=0", "--runsc-flag=--network=none", "--sandbox-network=pod")
        )
