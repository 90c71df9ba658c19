"""``_process.run_command`` when the process has no descriptor to spare (issue 30, item 4)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, anyio
    from substrate_gpu import _process, exceptions

    async def main():
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_now = len(os.listdir("/proc/self/fd"))  # counts its own, closed since: one spare
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now, hard))
        try:
            await _process.run_command(["true"], timeout=5, what="checking the limit")
        except exceptions.ExternalCommandError as e:
            print("refused:", e)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        result = await _process.run_command(["echo", "back"], timeout=5, what="after")
        print("after:", result.stdout.strip())

    anyio.run(main)
    """
)


def test_no_descriptor_for_the_output_files_is_a_command_error_not_a_crash():
    """EMFILE creating a command's output files fails that command clearly (ExternalCommandError,
    naming the cause); the next command, with descriptors free, runs."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "refused: while checking the limit: cannot start true" in done.stdout
    assert "Too many open files" in done.stdout
    assert "after: back" in done.stdout
