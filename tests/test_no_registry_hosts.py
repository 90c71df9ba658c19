"""The project names no package registry's host: tools are named ("the Go module proxy", pip).

Where a package comes from is the user's configuration (GOPROXY, pip's index): a host
written into a script comment or a doc reads as the one place to fetch from.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REGISTRY_HOSTS = re.compile(
    r"proxy\.golang\.org|sum\.golang\.org|pypi\.org|pythonhosted\.org|registry\.npmjs\.org"
    r"|index\.docker\.io|registry-1\.docker\.io"
)


def test_no_tracked_file_names_a_registry_host() -> None:
    """Every tracked text file outside the copied test data is free of registry hosts."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    found = []
    for name in listed:
        if name.startswith("tests/data/") or name == "tests/test_no_registry_hosts.py":
            continue
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [
            f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if REGISTRY_HOSTS.search(line)
        ]
    assert found == []
