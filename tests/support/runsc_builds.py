"""runsc "builds" for tests of several binaries at once (issue 31 §5): stand-in wrappers that
differ in their bytes, each reporting its own version and listing its own drivers, as two
gVisor releases would; each logs ``$0 $*`` to ``calls.log`` beside its directory, so a test
sees which build ran."""

from __future__ import annotations

import sys
from pathlib import Path

from substrate_gpu.testing import node as node_

#: The stand-in's script (run by path, as the node's wrapper does).
STANDIN_SCRIPT = Path(node_.__file__).with_name("runsc.py")


def build(directory: Path, version: str, drivers: str) -> Path:
    """``<directory>/runsc``: the stand-in reporting ``version`` and listing ``drivers``."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "runsc"
    binary.write_text(
        "#!/bin/sh\n"
        f'echo "$0 $*" >> {directory.parent / "calls.log"}\n'
        f"RUNSC_STANDIN_VERSION={version} RUNSC_STANDIN_DRIVERS={drivers} "
        f'exec {sys.executable} {STANDIN_SCRIPT} "$@"\n'
    )
    binary.chmod(0o755)
    return binary
