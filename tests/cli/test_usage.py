"""Command-line mistakes: each is answered with the usage of the command that was typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu.cli import EXIT_USAGE, main

POOLS = Path(__file__).resolve().parents[1] / "data" / "pools"
POOL = str(POOLS / "valid" / "cpu-pool.yaml")


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        pytest.param(["pool", "validate", POOL], "substrate-gpu pool validate", id="pool-validate"),
        pytest.param(["pool", "render", POOL], "substrate-gpu pool render", id="pool-render"),
        pytest.param(["pool", "crd"], "substrate-gpu pool crd", id="pool-crd"),
        pytest.param(["replay", "events.jsonl"], "substrate-gpu replay", id="replay"),
        pytest.param(
            ["inject", "--bundle", "b", "--cdi-spec", "s.json"], "substrate-gpu inject", id="inject"
        ),
        pytest.param(["cdi", "show", "s.json"], "substrate-gpu cdi show", id="cdi-show"),
        pytest.param(["agent", "--stdin"], "substrate-gpu agent", id="agent"),
    ],
)
def test_an_unknown_flag_prints_the_subcommands_usage(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`substrate-gpu pool validate F --bogus` shows pool validate's usage, not the top level's."""
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--no-such-flag"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")
    assert f"{prog}: error: unrecognized arguments: --no-such-flag" in err


def test_an_unknown_flag_before_the_command_prints_the_top_level_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A flag the top level does not know, given before any command, is the top level's mistake."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--no-such-flag", "pool", "crd"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: substrate-gpu [-h]")
    assert "substrate-gpu: error: unrecognized arguments: --no-such-flag" in err


def test_a_top_level_option_after_the_command_says_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`pool crd --log-level DEBUG`: the option belongs before the command, and the error says so."""
    with pytest.raises(SystemExit) as exit_info:
        main(["pool", "crd", "--log-level", "DEBUG"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: substrate-gpu pool crd")
    assert "--log-level is an option of substrate-gpu itself: give it before the command" in err


@pytest.mark.parametrize(
    ("argv", "typed", "meant"),
    [
        pytest.param(["agnet"], "agnet", "agent", id="command"),
        pytest.param(["pool", "valdate", POOL], "valdate", "validate", id="subcommand"),
        pytest.param(["--log-format", "jsno", "pool", "crd"], "jsno", "json", id="option-choice"),
    ],
)
def test_a_choice_one_typo_away_names_the_one_meant(
    argv: list[str], typed: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`substrate-gpu agnet`: exit 2, "did you mean 'agent'?", and the choices still listed."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"invalid choice: {typed!r} (did you mean {meant!r}? choose from " in err


def test_a_choice_near_nothing_only_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    """A word like no command gets the plain list, no guess."""
    with pytest.raises(SystemExit) as exit_info:
        main(["zzzz"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid choice: 'zzzz' (choose from" in err and "did you mean" not in err
