"""What the docs say has run on a real GPU agrees with the record of it (tests/data/gpu/README.md)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _machines() -> list[str]:
    """The machines tests/data/gpu/README.md lists under "Machines:" (none: "(none yet)")."""
    text = (REPO / "tests" / "data" / "gpu" / "README.md").read_text()
    listed = text.split("\nMachines:\n", 1)[1].splitlines()
    entries = [line[2:].strip() for line in listed if line.startswith("- ")]
    return [entry for entry in entries if entry != "(none yet)"]


def test_no_doc_claims_a_gpu_run_the_record_lacks() -> None:
    """With no machine recorded, the README and gpu-injection.md say plainly that none ran."""
    if _machines():
        return  # a recorded run: the sentences below are due for an update, not a test
    readme = " ".join((REPO / "README.md").read_text().split())
    injection = " ".join((REPO / "docs" / "gpu-injection.md").read_text().split())
    assert "Nothing here has yet run on a real GPU" in readme
    assert "No GPU has run any of these tests yet" in injection
    assert "two newest tests" not in injection
