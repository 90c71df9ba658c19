"""``substrate-gpu pool``: validate WorkerPool files, render worker Deployments, print the CRD.

Exit codes (see ``docs/api-guide.md``, "Exit codes"):

- ``pool validate``: 0 when every document is valid (warnings alone keep 0); 3 when any
  document has an error or any file is not YAML (every file is still checked); 1 when a
  file cannot be read at all (missing, not UTF-8), which wins over 3;
- ``pool render``: 0 with the YAML on stdout; 3 when a pool is invalid or the file is
  not YAML (nothing on stdout); 1 when the file cannot be read or rendering fails (no
  worker image);
- ``pool crd`` and ``pool deploy-files``: 0, or 1 on failure.

The controller's environment (``ATE_NVIDIA_TOOLKIT_HOST_PATH``, ``ATE_NVIDIA_DRIVER_ROOT``,
``ATE_DEFAULT_ATEOM_IMAGE``) is read here, at the edge, and passed down as settings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from substrate_gpu.cli import _errors
from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from substrate_gpu.pools import crd, manifests, shaping, validation

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pool validate|render|crd|deploy-files``."""
    pool = subparsers.add_parser("pool", help="WorkerPool validation, rendering and CRD")
    commands = pool.add_subparsers(dest="pool_command", required=True, metavar="SUBCOMMAND")

    validate = commands.add_parser(
        "validate", help="report every problem of WorkerPool files (exit 3 on any error)"
    )
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    validate.set_defaults(handler=_validate)

    render = commands.add_parser(
        "render", help="print the worker Deployments of WorkerPool files (for kubectl apply -f -)"
    )
    render.add_argument("file", type=Path, metavar="FILE")
    render.add_argument(
        "--ateom-image",
        help="worker image for pools without spec.ateomImage "
        f"(default: ${shaping.WORKER_IMAGE_ENV})",
    )
    render.set_defaults(handler=_render)

    crd_cmd = commands.add_parser("crd", help="print the WorkerPool CustomResourceDefinition")
    crd_cmd.set_defaults(handler=_crd)

    deploy = commands.add_parser("deploy-files", help="regenerate the checked-in deploy/ manifests")
    deploy.add_argument("--examples", type=Path, required=True, help="folder of example pools")
    deploy.add_argument("--output", type=Path, required=True, help="the deploy/ folder")
    deploy.set_defaults(handler=_deploy_files)


def _validate(args: argparse.Namespace) -> int:
    files: list[Path] = args.files
    errors = warnings = documents = 0
    unreadable = False
    for path in files:
        try:
            docs = manifests.read_documents(path)
        except manifests.PoolYamlError as e:
            print(f"error: {_errors.describe(e)}", file=sys.stderr)
            errors += 1
            continue
        except manifests.PoolFileError as e:
            print(f"error: {_errors.describe(e)}", file=sys.stderr)
            unreadable = True
            continue
        for doc in docs:
            documents += 1
            report = validation.validate_document(doc.content)
            for problem in report.errors:
                print(f"{doc.source}: error: {problem}", file=sys.stderr)
            for problem in report.warnings:
                print(f"{doc.source}: warning: {problem}", file=sys.stderr)
            errors += len(report.errors)
            warnings += len(report.warnings)
            if report.ok:
                print(f"{doc.source}: ok")
    print(
        f"{documents} document(s), {errors} error(s), {warnings} warning(s)",
        file=sys.stderr if errors or unreadable else sys.stdout,
    )
    if unreadable:
        return EXIT_FAILED
    return EXIT_INVALID if errors else EXIT_OK


def _settings(env: Mapping[str, str], image: str | None) -> shaping.ControllerSettings:
    settings = shaping.ControllerSettings.from_env(env)
    if image:
        settings = shaping.ControllerSettings(
            toolkit_host_path=settings.toolkit_host_path,
            driver_root=settings.driver_root,
            default_image=image,
        )
    return settings


def _render(args: argparse.Namespace) -> int:
    settings = _settings(os.environ, args.ateom_image)
    objects: list[Mapping[str, object]] = []
    invalid = False
    try:
        docs = manifests.read_documents(args.file)
    except manifests.PoolYamlError as e:
        print(f"error: {_errors.describe(e)}", file=sys.stderr)
        return EXIT_INVALID
    for doc in docs:
        report = validation.validate_document(doc.content)
        for problem in report.errors:
            print(f"{doc.source}: error: {problem}", file=sys.stderr)
        for problem in report.warnings:
            print(f"{doc.source}: warning: {problem}", file=sys.stderr)
        if not report.ok:
            invalid = True
            continue
        pool = validation.load_pool(doc.content, source=doc.source)
        objects.append(shaping.render_worker_deployment(pool, settings))
    if invalid:
        return EXIT_INVALID
    sys.stdout.write(manifests.dump_documents(objects))
    return EXIT_OK


def _crd(args: argparse.Namespace) -> int:
    sys.stdout.write(manifests.dump_documents([crd.render_crd()]))
    return EXIT_OK


def _deploy_files(args: argparse.Namespace) -> int:
    examples: Path = args.examples
    output: Path = args.output
    for name, content in manifests.deploy_files(sorted(examples.glob("*.yaml"))).items():
        target = output / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(f"wrote {target}")
    return EXIT_OK
