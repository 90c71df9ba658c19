"""Nothing shipped starts the demo unless asked: only docker-compose.yml says ``--demo``.

Checked: the Dockerfile's default target (what ``docker build .`` and any pod that runs the
image without args get), every manifest under deploy/ (found by glob, so new ones are
covered), and ``pool render`` of every example pool (what the controller creates).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import dockerfile

from substrate_gpu.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO_FLAG = "--demo"
MANIFESTS = sorted(
    p for pattern in ("*.yaml", "*.yml", "*.json") for p in (REPO / "deploy").rglob(pattern)
)
EXAMPLE_POOLS = sorted((REPO / "deploy" / "examples").glob("*.yaml")) + sorted(
    (REPO / "tests" / "data" / "pools" / "valid").glob("*.yaml")
)


def says_demo(text: str) -> bool:
    """Whether ``text`` mentions ``--demo`` at all (an argument, ``--demo=…``, even a comment:
    only docker-compose.yml may say it)."""
    return DEMO_FLAG in text


def test_the_image_default_does_not_start_the_demo() -> None:
    """The default target's ENTRYPOINT + CMD never mention --demo."""
    parsed = dockerfile.load(REPO / "Dockerfile")
    target = parsed.default_target
    for keyword in ("ENTRYPOINT", "CMD"):
        instruction = parsed.inherited(target, keyword)
        assert instruction is not None, keyword
        assert DEMO_FLAG not in instruction.exec_form(), f"{keyword} line {instruction.line}"


def test_there_are_manifests_and_pools_to_check() -> None:
    """The globs find files (a moved deploy/ must not turn the checks below into no-ops)."""
    assert any(p.parent.name == "rendered" for p in MANIFESTS)
    assert len(EXAMPLE_POOLS) >= 5


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_manifest_under_deploy_starts_the_demo(manifest: Path) -> None:
    """A shipped manifest never passes --demo (docker-compose.yml is the demo's only home)."""
    assert not says_demo(manifest.read_text(encoding="utf-8"))


@pytest.mark.parametrize("pool", EXAMPLE_POOLS, ids=lambda p: str(p.relative_to(REPO)))
def test_rendering_an_example_pool_never_starts_the_demo(
    pool: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pool render`` output for every example pool has no --demo anywhere."""
    code = main(["pool", "render", "--ateom-image", "registry.example/ateom:v1", str(pool)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip()
    assert not says_demo(out)


def test_the_check_sees_a_demo_flag_where_one_is() -> None:
    """The detector is not blind: a container passing --demo (either form) is caught."""
    assert says_demo("spec:\n  containers:\n  - args: [agent, --demo]\n")
    assert says_demo('command: ["substrate-gpu", "agent", "--demo=true"]\n')
    assert not says_demo("args: [agent, --socket, /run/a.sock, --metrics-port, '9477']\n")
    compose = (REPO / "docker-compose.yml").read_text(encoding="utf-8")
    assert says_demo(compose)  # the one place the demo is asked for
