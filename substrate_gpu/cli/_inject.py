"""``substrate-gpu inject`` and ``substrate-gpu cdi show``.

``inject`` is what the node agent does for each actor container, runnable by hand on a
node (docs/gpu-injection.md). ``cdi show`` prints what would be injected from a spec,
as tables, without touching any bundle.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from substrate_gpu import _defaults, exceptions
from substrate_gpu.cli import _types
from substrate_gpu.cli._exitcodes import EXIT_OK

# The injection stack is imported by the handlers: every other command, `--help` included,
# starts without it.

if TYPE_CHECKING:
    from collections.abc import Sequence

    from substrate_gpu.cdi import model


STANDIN_SYSTEM_ROOT_ENV = "NVIDIA_CTK_STANDIN_SYSTEM_ROOT"
"""The simulated node's root for the nvidia-ctk stand-in (named here for ``--help`` only:
production code never imports ``substrate_gpu.testing``)."""


def _common_paths(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--driver-root",
        default=os.environ.get(_defaults.DRIVER_ROOT_ENV) or str(_defaults.DRIVER_ROOT),
        help="NVIDIA driver root (default: $ATE_NVIDIA_DRIVER_ROOT or /usr/local/nvidia)",
    )
    parser.add_argument(
        "--dev-root",
        default="/",
        type=Path,
        help="host-root prefix for resolving device nodes (default: /)",
    )
    parser.add_argument(
        "--toolkit-dir",
        default=str(_defaults.TOOLKIT_DIR),
        type=_types.absolute_path,
        help="the mounted NVIDIA toolkit (default: /opt/nvidia-toolkit)",
    )
    parser.add_argument(
        "--max-spec-bytes",
        type=int,
        default=_defaults.MAX_SPEC_BYTES,
        metavar="BYTES",
        help="refuse a CDI spec file larger than this (default: 16 MiB; a generated spec is"
        " ~30 KiB)",
    )


def _load_spec(path: Path, args: argparse.Namespace) -> model.Spec:
    from substrate_gpu import cdi  # noqa: PLC0415

    spec = cdi.load_spec(path, max_bytes=args.max_spec_bytes)
    if spec.warning is not None:
        print(f"warning: {spec.warning}", file=sys.stderr)
    return spec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``inject`` and ``cdi``."""
    inject = subparsers.add_parser(
        "inject",
        help="inject this worker's GPUs into an OCI bundle",
        description="Inject the GPUs of a CDI spec (device 'all', or the --device names)"
        " into an OCI bundle.",
        epilog=f"--generate runs <toolkit-dir>/nvidia-ctk. On a simulated node (tests, the "
        f"demo; docs/gpu-injection.md) the toolkit is the nvidia-ctk stand-in, which treats "
        f"${STANDIN_SYSTEM_ROOT_ENV} as the machine's / when it discovers GPUs and libraries.",
    )
    inject.add_argument("--bundle", required=True, type=Path, help="the OCI bundle directory")
    source = inject.add_mutually_exclusive_group(required=True)
    source.add_argument("--cdi-spec", type=Path, help="a CDI spec file (JSON or YAML)")
    source.add_argument(
        "--generate",
        action="store_true",
        help="generate the spec with the mounted toolkit's nvidia-ctk first",
    )
    inject.add_argument(
        "--device",
        action="append",
        metavar="NAME",
        help="inject only this fully qualified CDI device (repeatable), e.g. nvidia.com/gpu=2,"
        " nvidia.com/gpu=GPU-<uuid> or a DRA claim's name (default: all GPUs)",
    )
    inject.add_argument(
        "--cdi-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="also resolve --device names against the specs in DIR (repeatable; a later"
        " directory wins over an earlier one, the --cdi-spec/--generate spec over both)",
    )
    inject.add_argument(
        "--cdi-output-dir",
        type=Path,
        default=Path("/var/run/cdi"),
        help="where --generate writes nvidia.json (default: /var/run/cdi)",
    )
    _common_paths(inject)
    inject.set_defaults(handler=run_inject)

    cdi_parser = subparsers.add_parser("cdi", help="inspect CDI specs")
    cdi_sub = cdi_parser.add_subparsers(dest="cdi_command", required=True, metavar="COMMAND")
    show = cdi_sub.add_parser(
        "show",
        help="show what a spec would inject",
        description="Show, as tables, what injecting a CDI spec would do: device 'all' (or,"
        " in a spec without one, such as a DRA claim's, every device of the spec), or only"
        " the --device names.",
    )
    show.add_argument("file", type=Path, help="the CDI spec (JSON or YAML)")
    show.add_argument(
        "--device",
        action="append",
        metavar="NAME",
        help="show only this fully qualified CDI device (repeatable), e.g. nvidia.com/gpu=0 or"
        " k8s.gpu.nvidia.com/claim=<claim-uid>-gpu-0 (default: 'all', else every device)",
    )
    show.add_argument(
        "--cdi-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="also resolve --device names against the specs in DIR (repeatable), as inject does",
    )
    _common_paths(show)
    show.set_defaults(handler=run_cdi_show)


async def _generated_spec(args: argparse.Namespace) -> model.Spec:
    from substrate_gpu.injection import toolkit  # noqa: PLC0415

    ctk = toolkit.toolkit_binary(args.toolkit_dir, "nvidia-ctk")
    if not ctk.exists():
        raise exceptions.ConfigError(
            f"while generating the CDI spec: no nvidia-ctk in {args.toolkit_dir} ({ctk} does "
            "not exist); pass --toolkit-dir with the mounted NVIDIA Container Toolkit, or "
            "give a spec with --cdi-spec"
        )
    config = toolkit.ToolkitConfig.from_env(
        {**os.environ, toolkit.ENV_DRIVER_ROOT: args.driver_root},
        output_dir=args.cdi_output_dir,
        toolkit_dir=args.toolkit_dir,
    )
    return await toolkit.CdiSpecGenerator(config).ensure_spec()


def run_inject(args: argparse.Namespace) -> int:
    """Handler of ``inject``."""
    from substrate_gpu import cdi  # noqa: PLC0415
    from substrate_gpu.injection import bundle as bundle_  # noqa: PLC0415
    from substrate_gpu.rootfs import SonameCache  # noqa: PLC0415

    if args.generate:
        import anyio  # noqa: PLC0415

        spec = anyio.run(_generated_spec, args)
    else:
        spec = _load_spec(args.cdi_spec, args)
    options = bundle_.InjectionOptions(
        driver_root=args.driver_root, dev_root=args.dev_root, toolkit_dir=args.toolkit_dir
    )
    if args.device:
        specs = cdi.load_spec_set(args.cdi_dir, extra=[spec])
        edits = cdi.edits_for_devices(specs, args.device)
    else:
        edits = cdi.edits_for_all(spec)
    report = bundle_.inject_gpu(args.bundle, edits, options=options, soname_cache=SonameCache())
    _maybe_warn_missing_hook(args.toolkit_dir, report.hooks_kept)
    print(f"{report.outcome}: {report.bundle}")
    for device in report.devices:
        print(f"  device {device.path} {device.type} {device.major}:{device.minor}")
    print(f"  mounts {report.mounts}, hooks kept {', '.join(report.hooks_kept) or '-'}")
    print(f"  hooks skipped {', '.join(report.hooks_skipped) or '-'}")
    if report.links is not None:
        links = report.links
        print(
            f"  soname links: {len(links.created)} created, {len(links.replaced)} replaced, "
            f"{len(links.existing)} existing, {len(links.skipped)} skipped"
        )
    return EXIT_OK


def _maybe_warn_missing_hook(toolkit_dir: Path, kept: Sequence[str]) -> None:
    """Kept hooks run ``<toolkit-dir>/nvidia-cdi-hook`` at container start: say if it is absent."""
    from substrate_gpu.injection import toolkit  # noqa: PLC0415

    binary = toolkit.hook_binary(toolkit_dir)
    if kept and not Path(binary).exists():
        print(
            f"substrate-gpu inject: warning: {binary} does not exist: the hooks kept "
            f"({', '.join(kept)}) will fail when the container starts; pass --toolkit-dir "
            "with the mounted NVIDIA Container Toolkit",
            file=sys.stderr,
        )


def _table(title: str, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{title} ({len(rows)})"]
    lines.extend(
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        for row in [header, *rows]
    )
    return "\n".join(line.rstrip() for line in lines)


def _device_row(node: model.DeviceNode, dev_root: Path) -> tuple[str, ...]:
    from substrate_gpu.injection import devices as devices_  # noqa: PLC0415

    access = devices_.cgroup_access(node.permissions) or "none (no rule)"
    if node.major:
        return (node.path, node.type or "c", f"{node.major}:{node.minor or 0}", access, "spec")
    on_host = devices_.host_path_under(dev_root, node.source)
    try:
        resolved = devices_.resolve_device(node, dev_root=dev_root)
    except exceptions.DeviceResolutionError:
        return (node.path, node.type or "?", "?:?", access, f"missing on host ({on_host})")
    return (node.path, resolved.type, f"{resolved.major}:{resolved.minor}", access, "host stat")


def _edits_to_show(spec: model.Spec, args: argparse.Namespace) -> tuple[model.ContainerEdits, str]:
    """The edits ``cdi show`` shows, and what they are, in words."""
    from substrate_gpu import cdi  # noqa: PLC0415

    if args.device:
        specs = cdi.load_spec_set(args.cdi_dir, extra=[spec])
        return cdi.edits_for_devices(specs, args.device), ", ".join(args.device)
    if spec.device(cdi.ALL_DEVICES) is not None:
        return cdi.edits_for_all(spec), f"spec-level edits + {cdi.ALL_DEVICES!r}"
    # No `all` (a DRA claim's spec holds only the claim's devices; an IMEX spec its
    # channels): what requesting every device of the spec gives, as inject --device would.
    names = [f"{spec.kind}={d.name}" for d in spec.devices]
    edits = cdi.edits_for_devices(cdi.SpecSet([spec]), names)
    return edits, f"spec-level edits + every device; the spec has no {cdi.ALL_DEVICES!r}"


def run_cdi_show(args: argparse.Namespace) -> int:
    """Handler of ``cdi show``."""
    from substrate_gpu.injection import oci, toolkit  # noqa: PLC0415

    spec = _load_spec(args.file, args)
    edits, injecting = _edits_to_show(spec, args)
    plan = oci.plan_injection(
        edits,
        (),
        driver_root=args.driver_root,
        hook_binary=toolkit.hook_binary(args.toolkit_dir),
    )
    print(f"{spec.source}: cdiVersion {spec.cdi_version}, kind {spec.kind}")
    names = ", ".join(d.name for d in spec.devices)
    print(f"devices in spec: {names} (injecting: {injecting})")
    nodes: dict[str, model.DeviceNode] = {}
    for node in edits.device_nodes:
        nodes.setdefault(node.path, node)
    sections = [
        _table(
            "Device nodes",
            ("PATH", "TYPE", "MAJOR:MINOR", "ACCESS", "NUMBERS FROM"),
            [_device_row(n, args.dev_root) for n in nodes.values()],
        ),
        _table(
            "Mounts",
            ("CONTAINER PATH", "HOST PATH", "OPTIONS"),
            [(m.container_path, m.host_path, ",".join(m.options)) for m in plan.mounts],
        ),
        _table("Env (appended)", ("ENTRY",), [(e,) for e in plan.env]),
        _table(
            "Hooks",
            ("VERDICT", "NAME", "HOOK POINT", "REASON"),
            [("keep", h.args[1], h.hook_name, "allowlisted, runs " + h.path) for h in plan.hooks]
            + [("skip", d.name, d.hook.hook_name, d.reason) for d in plan.skipped_hooks],
        ),
    ]
    print("\n\n".join(sections))
    lib_dir = plan.driver_library_dir or "(none: no driver library mounted)"
    print(f"\nLD_LIBRARY_PATH gets {lib_dir} prepended; NVIDIA_VISIBLE_DEVICES is dropped.")
    return EXIT_OK
