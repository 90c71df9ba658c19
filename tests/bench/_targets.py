"""How every benchmark here judges its targets (imported by the scripts; not one itself).

Each target is printed beside its figure as ``met`` or ``MISSED``, and a script exits 1
when any target it printed was missed, so a run in CI or a shell loop cannot pass
unnoticed. ``--smoke`` sizes are too small to judge: there each target reads
``not judged (--smoke)`` and the exit status is 0 (the suite runs every script that way,
tests/test_benchmarks.py).
"""

from __future__ import annotations


class Targets:
    """The targets one benchmark run judged, and whether any was missed."""

    def __init__(self, *, smoke: bool) -> None:
        self.smoke = smoke
        self.missed: list[str] = []

    def judge(self, target: str, met: bool) -> str:
        """``"<target>: met"`` or ``"<target>: MISSED"`` (remembered), to print beside the
        figure; in a smoke run ``"<target>: not judged (--smoke)"``."""
        if self.smoke:
            return f"{target}: not judged (--smoke)"
        if not met:
            self.missed.append(target)
        return f"{target}: {'met' if met else 'MISSED'}"

    def exit_status(self) -> int:
        """Print the summary line; 1 when a target was missed, else 0."""
        if self.smoke:
            print("targets: not judged (--smoke)")
            return 0
        if self.missed:
            print(f"targets: {len(self.missed)} MISSED: " + "; ".join(self.missed))
            return 1
        print("targets: all met")
        return 0
