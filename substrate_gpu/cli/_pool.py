"""``substrate-gpu pool``: validate WorkerPool files, render worker Deployments, print the CRD.

Exit codes (see ``docs/api-guide.md``, "Exit codes"):

- ``pool validate``: 0 when every document is valid (warnings alone keep 0); 3 when any
  document has an error or any file is not YAML (every file is still checked); 1 when a
  file cannot be read at all (missing, not UTF-8), which wins over 3;
- ``pool validate`` warns (exit 0) about a pool that no image reaches (no
  ``spec.workerImage``, none configured, and no built-in default for it): ``pool render``
  would refuse it;
- ``pool render FILE…``: 0 with every file's Deployments on stdout, in order; 3 when a pool
  is invalid or a file is not YAML; 1 when a file cannot be read or a pool cannot be
  rendered (no worker image), which wins over 3; every file is checked and every problem
  printed, and nothing is printed on stdout unless everything renders;
- ``pool crd`` and ``pool deploy-files``: 0, or 1 on failure.

The controller's environment (``ATE_NVIDIA_TOOLKIT_HOST_PATH``, ``ATE_NVIDIA_DRIVER_ROOT``,
``ATE_DEFAULT_WORKER_IMAGE``) is read here, at the edge, and passed down as settings; with
none of it set and no flag, ``pool render`` of ``deploy/examples/X.yaml`` prints
``deploy/rendered/X.yaml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from substrate_gpu import _defaults, exceptions
from substrate_gpu.cli import _errors
from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_INVALID, EXIT_OK

# The pools package (and PyYAML) is imported by the handlers: the other commands of the
# CLI start without it.
if TYPE_CHECKING:
    from substrate_gpu.pools import model, shaping

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pool validate|render|crd|deploy-files``."""
    pool = subparsers.add_parser("pool", help="WorkerPool validation, rendering and CRD")
    pool.set_defaults(logs="never")  # see cli.main
    commands = pool.add_subparsers(dest="pool_command", required=True, metavar="SUBCOMMAND")

    validate = commands.add_parser(
        "validate", help="report every problem of WorkerPool files (exit 3 on any error)"
    )
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _image_flag(validate, "the default image, for the warning about pools without one")
    validate.set_defaults(handler=_validate)

    render = commands.add_parser(
        "render",
        help="print the worker Deployments of WorkerPool files (for kubectl apply -f -)",
        description="Print the worker Deployment of every pool of every FILE, in order, as "
        "one YAML stream; nothing is printed unless every pool renders.",
    )
    render.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _image_flag(render, "worker image for pools without spec.workerImage")
    render.set_defaults(handler=_render)

    crd_cmd = commands.add_parser("crd", help="print the WorkerPool CustomResourceDefinition")
    crd_cmd.set_defaults(handler=_crd)

    deploy = commands.add_parser("deploy-files", help="regenerate the checked-in deploy/ manifests")
    deploy.add_argument("--examples", type=Path, required=True, help="folder of example pools")
    deploy.add_argument("--output", type=Path, required=True, help="the deploy/ folder")
    deploy.set_defaults(handler=_deploy_files)


def _image_flag(parser: argparse.ArgumentParser, what: str) -> None:
    # --ateom-image: the flag's name before upstream renamed ateomImage to workerImage.
    parser.add_argument(
        "--worker-image",
        "--ateom-image",
        dest="worker_image",
        metavar="IMAGE",
        help=f"{what} (default: ${_defaults.WORKER_IMAGE_ENV}, else the built-in default of "
        "GPU gVisor pools)",
    )


@dataclasses.dataclass
class _Outcome:
    """What reading and checking a list of pool files found (problems already printed)."""

    pools: list[tuple[str, model.WorkerPool]] = dataclasses.field(default_factory=list)
    documents: int = 0
    errors: int = 0
    warnings: int = 0
    unreadable: int = 0
    """Files that could not be read at all."""

    @property
    def exit_code(self) -> int:
        """1 when a file could not be read (wins), 3 when anything was invalid, else 0."""
        if self.unreadable:
            return EXIT_FAILED
        return EXIT_INVALID if self.errors else EXIT_OK


def _check_files(
    files: list[Path], settings: shaping.ControllerSettings, *, validating: bool
) -> _Outcome:
    """Read and validate every document of every file, printing each problem on stderr.

    ``validating`` (``pool validate``): also say ``ok`` on stdout for each valid document,
    and warn about pools that render cannot give an image (``render`` reports that as
    its error, and its stdout is YAML only).
    """
    from substrate_gpu.pools import manifests, shaping, validation  # noqa: PLC0415

    outcome = _Outcome()
    for path in files:
        try:
            docs = manifests.read_documents(path)
        except manifests.PoolYamlError as e:
            print(f"error: {_errors.describe(e)}", file=sys.stderr)
            outcome.errors += 1
            continue
        except manifests.PoolFileError as e:
            print(f"error: {_errors.describe(e)}", file=sys.stderr)
            outcome.unreadable += 1
            continue
        for doc in docs:
            outcome.documents += 1
            report = validation.validate_document(doc.content)
            warnings = [str(problem) for problem in report.warnings]
            if report.ok:
                pool = validation.load_pool(doc.content, source=doc.source)
                if validating and shaping.worker_image(pool, settings) is None:
                    warnings.append(_NO_IMAGE)
                outcome.pools.append((doc.source, pool))
            for problem in report.errors:
                print(f"{doc.source}: error: {problem}", file=sys.stderr)
            for warning in warnings:
                print(f"{doc.source}: warning: {warning}", file=sys.stderr)
            if validating and report.ok:
                print(f"{doc.source}: ok")
            outcome.errors += len(report.errors)
            outcome.warnings += len(warnings)
    return outcome


_NO_IMAGE = (
    "spec.workerImage: not set, no default worker image is configured "
    f"(${_defaults.WORKER_IMAGE_ENV} or --worker-image), and only GPU pools on gVisor have a "
    "built-in one: pool render will refuse this pool"
)


def _validate(args: argparse.Namespace) -> int:
    outcome = _check_files(args.files, _settings(os.environ, args.worker_image), validating=True)
    # An unread file holds an unknown number of documents: "0 document(s), 0 error(s)"
    # alone would read as a clean pass.
    unread = f"; {outcome.unreadable} file(s) could not be read" if outcome.unreadable else ""
    print(
        f"{outcome.documents} document(s), {outcome.errors} error(s), "
        f"{outcome.warnings} warning(s){unread}",
        file=sys.stderr if outcome.exit_code != EXIT_OK else sys.stdout,
    )
    return outcome.exit_code


def _settings(env: Mapping[str, str], image: str | None) -> shaping.ControllerSettings:
    from substrate_gpu.pools import shaping  # noqa: PLC0415

    settings = shaping.ControllerSettings.from_env(env)
    if image:
        settings = dataclasses.replace(settings, default_image=image)
    return settings


def _render(args: argparse.Namespace) -> int:
    from substrate_gpu.pools import manifests, shaping  # noqa: PLC0415

    settings = _settings(os.environ, args.worker_image)
    outcome = _check_files(args.files, settings, validating=False)
    if outcome.exit_code != EXIT_OK:
        return outcome.exit_code
    objects: list[Mapping[str, object]] = []
    failed = False
    for source, pool in outcome.pools:
        try:
            objects.append(shaping.render_worker_deployment(pool, settings))
        except shaping.MissingWorkerImageError as e:
            # The controller's words; here the flag is the quickest way out.
            print(
                f"{source}: error: {_errors.describe(e)} (or give --worker-image IMAGE)",
                file=sys.stderr,
            )
            failed = True
        except exceptions.SubstrateGpuError as e:
            print(f"{source}: error: {_errors.describe(e)}", file=sys.stderr)
            failed = True
    if failed:
        return EXIT_FAILED
    sys.stdout.write(manifests.dump_documents(objects))
    return EXIT_OK


def _crd(args: argparse.Namespace) -> int:
    from substrate_gpu.pools import crd, manifests  # noqa: PLC0415

    sys.stdout.write(manifests.dump_documents([crd.render_crd()]))
    return EXIT_OK


def _deploy_files(args: argparse.Namespace) -> int:
    from substrate_gpu.pools import manifests  # noqa: PLC0415

    examples: Path = args.examples
    output: Path = args.output
    if not examples.is_dir():
        raise exceptions.ConfigError(
            f"while reading the example pools in {examples}: no such folder; check the path"
        )
    files = manifests.deploy_files(sorted(examples.glob("*.yaml")))
    for name, content in files.items():
        target = output / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as e:
            raise exceptions.ConfigError(f"while writing {output}: {e}") from e
        print(f"wrote {target}")
    return EXIT_OK
