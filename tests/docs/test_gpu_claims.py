"""What the docs say has run on a real GPU agrees with the record of it (tests/data/gpu/README.md).

The record lists the machines the ``gpu`` tests have run on. With none, the README and
docs/gpu-injection.md must say plainly that nothing ran on a GPU; with one, they must no
longer say so, each machine must be described (GPU, driver, toolkit, date), and its findings
(the JSON files the record's table names) must be there. The check is one function of the
texts, run on the repository and on a record with a machine in it, so neither branch can pass
by not being looked at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_DATA = REPO / "tests" / "data" / "gpu"

#: The sentences that say no GPU ran anything: (where, sentence).
NONE_RAN = (
    ("README.md", "Nothing here has yet run on a real GPU"),
    ("docs/gpu-injection.md", "No GPU has run any of these tests yet"),
    ("tests/data/gpu/README.md", "No GPU has run them yet"),
)
#: A machine line names a driver version (e.g. 580.65.06) and a date (YYYY-MM-DD).
DRIVER = re.compile(r"\b\d{3}\.\d+(?:\.\d+)?\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


@dataclass(frozen=True)
class Record:
    """The texts the claims live in, and the findings files present."""

    texts: dict[str, str]
    """Each file of :data:`NONE_RAN` by its repository path, whitespace folded."""
    record: str
    """tests/data/gpu/README.md as written."""
    findings: frozenset[str]
    """The names of the files in tests/data/gpu besides its README."""


def _fold(text: str) -> str:
    return " ".join(text.split())


def _repository() -> Record:
    record = (GPU_DATA / "README.md").read_text()
    return Record(
        texts={where: _fold((REPO / where).read_text()) for where, _ in NONE_RAN},
        record=record,
        findings=frozenset(p.name for p in GPU_DATA.iterdir() if p.name != "README.md"),
    )


def machines(record: str) -> list[str]:
    """The machines the record lists under "Machines:" (none: "(none yet)")."""
    listed = record.split("\nMachines:\n", 1)[1].splitlines()
    entries = [line[2:].strip() for line in listed if line.startswith("- ")]
    return [entry for entry in entries if entry != "(none yet)"]


def tabled_findings(record: str) -> set[str]:
    """The findings files the record's table names (its first column)."""
    return set(re.findall(r"^\| `([^`]+\.json)` \|", record, flags=re.MULTILINE))


def disagreements(record: Record) -> list[str]:
    """Every way the docs and the record disagree (none: they agree)."""
    ran = machines(record.record)
    problems = []
    for where, sentence in NONE_RAN:
        said = sentence in record.texts[where]
        if ran and said:
            problems.append(f"{where} still says {sentence!r}, but the record lists {ran}")
        if not ran and not said:
            problems.append(f"{where} no longer says {sentence!r}, but the record lists none")
    if not ran and "two newest tests" in record.texts["docs/gpu-injection.md"]:
        problems.append("docs/gpu-injection.md speaks of GPU test results the record lacks")
    for machine in ran:
        if not (DRIVER.search(machine) and DATE.search(machine)):
            problems.append(
                f"machine {machine!r} does not name its driver version and a date (YYYY-MM-DD)"
            )
    if ran:
        missing = sorted(tabled_findings(record.record) - record.findings)
        if missing == sorted(tabled_findings(record.record)):
            problems.append(f"the record lists {ran} but none of its findings is there")
    if not ran and record.findings:
        problems.append(f"findings {sorted(record.findings)} are there, but no machine is listed")
    return problems


def test_no_doc_claims_a_gpu_run_the_record_lacks() -> None:
    """The repository as it is: the docs say what the record says."""
    assert disagreements(_repository()) == []


def test_the_record_names_its_findings_files() -> None:
    """The table the check reads lists the files the gpu tests write."""
    assert "device-nodes.json" in tabled_findings(_repository().record)


def _with_machine(record: Record, machine: str, findings: frozenset[str]) -> Record:
    text = record.record.replace("- (none yet)", f"- {machine}")
    assert text != record.record
    return Record(texts=record.texts, record=text, findings=findings)


MACHINE = "1x NVIDIA T4, driver 580.65.06, toolkit 1.18.0, 2026-12-01"


@pytest.mark.parametrize(
    ("machine", "findings", "expected"),
    [
        pytest.param(
            MACHINE,
            frozenset({"device-nodes.json"}),
            ["README.md still says", "docs/gpu-injection.md still says", "gpu/README.md still"],
            id="docs-still-say-none-ran",
        ),
        pytest.param(
            MACHINE,
            frozenset(),
            ["none of its findings is there"],
            id="no-findings",
        ),
        pytest.param(
            "a T4 somewhere",
            frozenset({"device-nodes.json"}),
            ["does not name its driver version and a date"],
            id="machine-undescribed",
        ),
    ],
)
def test_a_recorded_machine_is_checked_too(machine, findings, expected) -> None:
    """A record that lists a machine is held to the docs as well (it used to end the test)."""
    found = disagreements(_with_machine(_repository(), machine, findings))
    for part in expected:
        assert any(part in problem for problem in found), found


def test_findings_without_a_machine_disagree() -> None:
    repository = _repository()
    found = disagreements(
        Record(repository.texts, repository.record, frozenset({"device-nodes.json"}))
    )
    assert found == ["findings ['device-nodes.json'] are there, but no machine is listed"]
