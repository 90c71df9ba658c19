"""What the CLI says when something fails: plain words, one context, and what to do."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from substrate_gpu import exceptions
from substrate_gpu.cli import EXIT_FAILED, _errors, main

NESTED_WHILE = re.compile(r"while [^:]*: while ")


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EXIT_FAILED
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["pool", "validate"], id="pool-validate"),
        pytest.param(["pool", "render"], id="pool-render"),
        pytest.param(["replay"], id="replay"),
        pytest.param(["cdi", "show"], id="cdi-show"),
    ],
)
def test_a_missing_file_is_named_in_words_with_what_to_do(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `[Errno 2] …`: the file, "no such file or directory" and "check the path"."""
    missing = tmp_path / "nope.yaml"
    err = _fails([*command, str(missing)], capsys)
    assert "[Errno" not in err
    assert str(missing) in err
    assert "check the path" in err


def test_a_directory_given_for_a_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EISDIR reads as "is a directory", with the hint to give a file."""
    err = _fails(["pool", "validate", str(tmp_path)], capsys)
    assert "[Errno" not in err
    assert "is a directory; give a file" in err


def test_a_failed_generation_names_its_context_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvidia-ctk fails: one "while generating the CDI spec …", not the same context twice."""
    toolkit_dir = tmp_path / "toolkit"
    toolkit_dir.mkdir()
    ctk = toolkit_dir / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\necho 'failed to load NVML' >&2\nexit 3\n")
    ctk.chmod(0o755)
    err = _fails(
        [
            "inject",
            "--bundle",
            str(tmp_path),
            "--generate",
            "--cdi-output-dir",
            str(tmp_path / "cdi"),
            "--toolkit-dir",
            str(toolkit_dir),
        ],
        capsys,
    )
    assert err.count("while generating the CDI spec") == 1
    assert not NESTED_WHILE.search(err)
    assert "failed to load NVML" in err


def _chained(message: str, cause: BaseException) -> exceptions.SubstrateGpuError:
    try:
        raise exceptions.SubstrateGpuError(message) from cause
    except exceptions.SubstrateGpuError as e:
        return e


@pytest.mark.parametrize(
    ("message", "cause", "expected"),
    [
        pytest.param(
            "while reading pool file /p.yaml: [Errno 2] No such file or directory: '/p.yaml'",
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/p.yaml"),
            "while reading pool file /p.yaml: no such file or directory; check the path",
            id="raw-oserror-text-replaced",
        ),
        pytest.param(
            "cannot read the spec file: No such file or directory",
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/s.json"),
            "cannot read the spec file: no such file or directory; check the path",
            id="strerror-tail-gets-the-hint",
        ),
        pytest.param(
            "no event log at /l.jsonl",
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/l.jsonl"),
            "no event log at /l.jsonl; check the path",
            id="worded-message-gets-the-hint",
        ),
        pytest.param(
            "while moving the log: [Errno 18] Invalid cross-device link: '/a' -> '/b'",
            OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"),
            "while moving the log: invalid cross-device link (/a -> /b)",
            id="paths-only-the-cause-named-are-kept",
        ),
        pytest.param(
            "while writing /x: [Errno 13] Permission denied: '/x'",
            PermissionError(errno.EACCES, "Permission denied", "/x"),
            "while writing /x: permission denied; run as a user who may access it (root?)",
            id="permission",
        ),
        pytest.param(
            "while generating the CDI spec: while generating the CDI spec with nvidia-ctk: boom",
            ValueError("boom"),
            "while generating the CDI spec with nvidia-ctk: boom",
            id="refined-context-replaces-the-outer-one",
        ),
        pytest.param(
            "while injecting GPUs into bundle /b: while staging links in /r: boom",
            ValueError("boom"),
            "while injecting GPUs into bundle /b (staging links in /r): boom",
            id="distinct-contexts-merge",
        ),
    ],
)
def test_describe_words_errors_for_people(
    message: str, cause: BaseException, expected: str
) -> None:
    """The one place CLI errors are worded: OSError text, hints, nested contexts."""
    assert _errors.describe(_chained(message, cause)) == expected
