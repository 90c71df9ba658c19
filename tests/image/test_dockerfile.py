"""The Dockerfile, read without a Docker engine: stages, bases, and the production default.

The default target (the last stage) is the production agent: glibc-based, unprivileged,
runsc built from source at the pinned version, and a command the real agent parser accepts
with its state under /var/lib/substrate-gpu. The demo is its own target, the one
docker-compose.yml builds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path, PurePosixPath

import pytest
import yaml
from support import dockerfile
from support import real_runsc as real_runsc_

from substrate_gpu.cli import _agent, build_parser
from substrate_gpu.observability.http import DEFAULT_PORT

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = dockerfile.load(REPO / "Dockerfile")
AGENT = DOCKERFILE.default_target
STATE_DIR = PurePosixPath("/var/lib/substrate-gpu")
UNPRIVILEGED_UID = "10001"


def parsed_command(stage: dockerfile.Stage) -> argparse.Namespace:
    """ENTRYPOINT + CMD of ``stage``, parsed by substrate-gpu's own argument parser."""
    entrypoint = DOCKERFILE.inherited(stage, "ENTRYPOINT")
    cmd = DOCKERFILE.inherited(stage, "CMD")
    assert entrypoint is not None and cmd is not None
    assert entrypoint.exec_form() == ["substrate-gpu"]
    return build_parser().parse_args(cmd.exec_form())


def run_lines(stage: dockerfile.Stage) -> str:
    return "\n".join(i.args for i in stage.all("RUN"))


def test_the_stages_are_runsc_wheel_base_demo_and_agent_last() -> None:
    """Five named stages; the default target (the last) is ``agent``."""
    assert [s.name for s in DOCKERFILE.stages] == ["runsc", "wheel", "base", "demo", "agent"]
    assert AGENT.name == "agent"


def test_python_stages_are_glibc_based() -> None:
    """Every Python stage is Debian slim bookworm (glibc: a mounted nvidia-ctk must exec)."""
    assert DOCKERFILE.stage("wheel").base == "python:3.11-slim-bookworm"
    assert DOCKERFILE.stage("base").base == "python:3.11-slim-bookworm"
    assert DOCKERFILE.stage("demo").base == "base"
    assert AGENT.base == "base"
    for stage in DOCKERFILE.stages:
        assert not re.search(r"alpine|musl|distroless", stage.base), stage.base


def test_runsc_is_built_from_source_at_the_pinned_version() -> None:
    """A Go >= 1.26 stage runs scripts/build-runsc.sh with scripts/runsc.version beside it;
    the agent stage takes its output as /usr/local/bin/runsc, the path its command uses."""
    runsc = DOCKERFILE.stage("runsc")
    image, _, tag = runsc.base.partition(":")
    assert image == "golang"
    major, minor = (int(n) for n in re.match(r"(\d+)\.(\d+)", tag).groups())  # type: ignore[union-attr]
    assert (major, minor) >= (1, 26)
    assert "bookworm" in tag  # glibc, like the stage the binary lands in
    copies = " ".join(i.args for i in runsc.all("COPY"))
    assert "scripts/build-runsc.sh" in copies and "scripts/runsc.version" in copies
    assert "scripts/build-runsc.sh" in run_lines(runsc)
    assert (REPO / "scripts" / "build-runsc.sh").is_file()
    assert real_runsc_.pinned_version()  # the pin the script reads exists and is readable
    (copy,) = [i for i in AGENT.all("COPY") if i.args.startswith("--from=runsc ")]
    destination = copy.args.split()[-1]
    assert destination == "/usr/local/bin/runsc"
    assert parsed_command(AGENT).runsc == destination


def test_the_default_target_runs_the_production_agent() -> None:
    """``substrate-gpu agent`` with a socket, the event log and checkpoints under the state
    directory, metrics on 0.0.0.0:9477, JSON logs; never --demo."""
    args = parsed_command(AGENT)
    assert args.command == "agent"
    assert args.demo is False
    assert args.log_format == "json"
    config = _agent.config_from(args)
    assert config.socket is not None and config.event_log is not None
    assert PurePosixPath(config.event_log).parent == STATE_DIR
    assert STATE_DIR in PurePosixPath(config.checkpoint_root).parents
    assert (config.metrics_host, config.metrics_port) == ("0.0.0.0", DEFAULT_PORT)


def test_every_directory_the_agent_writes_is_made_for_its_user() -> None:
    """The socket's, log's, checkpoints', runsc root's and CDI dirs exist, owned by the agent's
    uid, in the image (an unprivileged user cannot create them under /var or /run)."""
    config = _agent.config_from(parsed_command(AGENT))
    made = re.search(r"install -d -o (\d+) -g (\d+) -m 0700 ([^&]+)", run_lines(AGENT))
    assert made is not None
    assert made.group(1) == made.group(2) == UNPRIVILEGED_UID
    directories = {PurePosixPath(d) for d in made.group(3).split()}
    assert config.socket is not None and config.event_log is not None
    needed = {
        PurePosixPath(config.socket).parent,
        PurePosixPath(config.event_log).parent,
        PurePosixPath(config.checkpoint_root),
        PurePosixPath(config.runsc_root),
        PurePosixPath(config.cdi_output_dir),
    }
    assert needed <= directories


@pytest.mark.parametrize("target", ["agent", "demo"])
def test_every_target_runs_unprivileged_and_exposes_the_metrics_port(target: str) -> None:
    """USER is the numeric non-root uid (a runAsNonRoot pod can verify it); EXPOSE 9477."""
    stage = DOCKERFILE.stage(target)
    user = DOCKERFILE.inherited(stage, "USER")
    assert user is not None
    uid, _, gid = user.args.partition(":")
    assert uid == gid == UNPRIVILEGED_UID
    assert "useradd --system --uid 10001" in run_lines(DOCKERFILE.stage("base"))
    expose = DOCKERFILE.inherited(stage, "EXPOSE")
    assert expose is not None and expose.args == str(DEFAULT_PORT)


def test_the_demo_target_has_a_compiler_and_asks_for_the_demo() -> None:
    """gcc and libc headers (the simulated node builds real ELF libraries); CMD --demo."""
    demo = DOCKERFILE.stage("demo")
    assert re.search(r"apt-get install .*\bgcc\b.*\blibc6-dev\b", run_lines(demo))
    assert parsed_command(demo).demo is True
    assert "gcc" not in run_lines(AGENT) + run_lines(DOCKERFILE.stage("base"))


def test_compose_builds_the_demo_target() -> None:
    """docker-compose.yml builds the ``demo`` stage of this Dockerfile."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    build = compose["services"]["agent"]["build"]
    assert build == {"context": ".", "target": "demo"}
    assert DOCKERFILE.stage(build["target"])


def test_every_copied_path_exists_and_is_not_docker_ignored() -> None:
    """Each COPY source from the context exists, and .dockerignore does not drop it."""
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for stage in DOCKERFILE.stages:
        for copy in stage.all("COPY"):
            if copy.args.startswith("--from="):
                continue
            *sources, _ = copy.args.split()
            for source in sources:
                assert (REPO / source).exists(), f"line {copy.line}: {source}"
                top = source.split("/")[0]
                assert top not in ignored, f"line {copy.line}: {source} is in .dockerignore"


def test_the_parser_rejects_what_it_does_not_understand() -> None:
    """The Dockerfile reader fails loudly (a check on a misread file would prove nothing)."""
    with pytest.raises(AssertionError, match="line 1: RUN before the first FROM"):
        dockerfile.parse("RUN true\n")
    with pytest.raises(AssertionError, match=r"line 2: \$NOPE is not a global ARG"):
        dockerfile.parse("ARG A=x\nFROM $NOPE\n")
    with pytest.raises(AssertionError, match="line 2: CMD is not in exec form"):
        dockerfile.parse("FROM x\nCMD agent --demo\n").stages[0].instructions[0].exec_form()
