"""``substrate-gpu controller`` as a child process, logged in as its ServiceAccount."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
DEADLINE_S = 40.0


class ControllerProcess:
    """The real CLI, its log kept for failure messages; start, kill and start again."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, env: Mapping[str, str]) -> None:
        self.kubeconfig, self.namespace, self.log, self.env = kubeconfig, namespace, log, env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ATE_", "KUBERNETES_"))
        }
        env |= {"KUBECONFIG": str(self.kubeconfig), **self.env}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "substrate_gpu",
                    "--log-format",
                    "console",
                    "controller",
                    "--namespace",
                    self.namespace,
                    "--retry-delay",
                    "0.5",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalising of whatever it was doing."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_for(self, what: str, probe: Callable[[], T | None], deadline: float = DEADLINE_S) -> T:
        """Poll ``probe`` until it returns something other than None."""
        end = time.monotonic() + deadline
        last: Any = None
        while time.monotonic() < end:
            try:
                result = probe()
            except (OSError, AssertionError) as e:  # the API server restarting
                last = e
                result = None
            if result is not None:
                return result
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(
                    f"the controller exited while waiting for {what}:\n{self.log_tail()}"
                )
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} ({last}):\n{self.log_tail()}")
