"""Reading a Dockerfile without a Docker engine: stages, their bases and instructions.

Enough of the Dockerfile grammar for the checks in ``tests/image``: comments and parser
directives, ``\\`` line continuations (comment lines inside them skipped, as BuildKit does),
global ``ARG``s before the first ``FROM`` substituted into ``FROM`` (``${NAME}`` and
``$NAME``), ``FROM base [AS name]``, and exec-form (JSON array) arguments. Anything it
does not understand is an error naming the line, never a silent skip.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case), its argument text, its first line."""

    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str]:
        """The JSON-array form of the arguments (``CMD ["a", "b"]``); an error otherwise."""
        try:
            value = json.loads(self.args)
        except json.JSONDecodeError as e:
            raise AssertionError(
                f"line {self.line}: {self.keyword} is not in exec form: {e}"
            ) from None
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise AssertionError(f"line {self.line}: {self.keyword} is not a JSON string array")
        return value


@dataclass
class Stage:
    """A build stage: ``FROM base [AS name]`` and the instructions after it."""

    base: str
    """The base image, global ARGs substituted (or another stage's name)."""
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        """Every ``keyword`` instruction of this stage, in order."""
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        """The ``keyword`` instruction in effect at the end of the stage (the last one)."""
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    """A parsed Dockerfile."""

    args: dict[str, str]
    """Global ARGs (before the first FROM) and their defaults."""
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        """The stage called ``name``."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise AssertionError(f"no stage named {name!r}")

    @property
    def default_target(self) -> Stage:
        """What ``docker build`` without ``--target`` builds: the last stage."""
        return self.stages[-1]

    def inherited(self, stage: Stage, keyword: str) -> Instruction | None:
        """``keyword`` as ``stage`` ends up with it, following ``FROM <another stage>``.

        CMD, ENTRYPOINT, USER, EXPOSE and ENV carry over from a stage used as a base.
        """
        current: Stage | None = stage
        while current is not None:
            found = current.last(keyword)
            if found is not None:
                return found
            current = next((s for s in self.stages if s.name == current.base), None)
        return None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each instruction, continuations joined."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments and directives, also inside a continuation
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        out.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        raise AssertionError(f"line {start}: a continuation runs past the end of the file")
    return out


def _substitute(text: str, args: dict[str, str], line: int) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args:
            raise AssertionError(f"line {line}: ${name} is not a global ARG")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def parse(text: str) -> Dockerfile:
    """Parse ``text``; an AssertionError names the line of anything not understood."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        keyword, _, rest = logical.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform=")]
            if len(words) == 1:
                base, name = words[0], None
            elif len(words) == 3 and words[1].upper() == "AS":
                base, name = words[0], words[2]
            else:
                raise AssertionError(f"line {line}: FROM {rest!r} is not 'FROM image [AS name]'")
            stages.append(Stage(_substitute(base, args, line), name, line))
        elif not stages:
            if keyword != "ARG":
                raise AssertionError(f"line {line}: {keyword} before the first FROM")
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, line))
    if not stages:
        raise AssertionError("no FROM: not a Dockerfile")
    return Dockerfile(args, stages)


def load(path: Path) -> Dockerfile:
    """Parse the Dockerfile at ``path``."""
    return parse(path.read_text(encoding="utf-8"))
