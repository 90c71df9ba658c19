"""A stand-in for ``nvidia-cdi-hook``: records each invocation, performs create-symlinks.

Runs as an OCI createContainer hook: the runtime passes the container state on stdin
(``bundle`` names the bundle, whose config.json names the rootfs). Each invocation is
appended as one JSON line (argv and the state's ``id``/``bundle``) to the file named by
``NVIDIA_CDI_HOOK_STANDIN_LOG`` (the installed wrapper sets it next to itself).
``create-symlinks --link TARGET::LINK`` creates the links inside the container root,
confined to it like the real hook; other subcommands only record.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = list(sys.argv[1:] if argv is None else argv)  # the hook's full argv, argv[0] first
    raw = sys.stdin.read() if not sys.stdin.isatty() else ""
    try:
        state = json.loads(raw) if raw.strip() else {}
    except ValueError:
        state = {}
    log_path = os.environ.get("NVIDIA_CDI_HOOK_STANDIN_LOG") or "hook-invocations.jsonl"
    record = {"argv": args, "id": state.get("id"), "bundle": state.get("bundle")}
    with Path(log_path).open("a") as f:
        f.write(json.dumps(record) + "\n")
    if len(args) > 1 and args[1] == "create-symlinks" and state.get("bundle"):
        from substrate_gpu.rootfs import confined  # noqa: PLC0415

        bundle = Path(state["bundle"])
        config = json.loads((bundle / "config.json").read_text())
        rootfs = bundle / config["root"]["path"]
        links = [a for i, a in enumerate(args) if i > 0 and args[i - 1] == "--link"]
        for link in links:
            target, _, path = link.partition("::")
            confined.ensure_symlink_in_root(rootfs, path, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
