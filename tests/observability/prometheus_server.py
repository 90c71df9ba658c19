"""A real Prometheus server for tests: the project's config, a test target, 127.0.0.1 only.

``metrics/prometheus.yml`` is rendered with the test's target and a 1 s scrape/evaluation
interval; everything else (job name, rule files) is used as written.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .conftest import METRICS_DIR

DEADLINE_S = 12.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusAPI:
    def __init__(self, port: int) -> None:
        self.api = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.api}/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=2) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a non-empty result (or the deadline)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                result = self.query(expr)
            except OSError:
                result = []
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never returned a result for {expr}")
            time.sleep(0.2)


@contextlib.contextmanager
def running_prometheus(
    binary: str, target: str, workdir: Path, *, extra_args: tuple[str, ...] = ()
) -> Iterator[PrometheusAPI]:
    """Prometheus on 127.0.0.1 scraping ``target`` (host:port) with the project's config."""
    config = yaml.safe_load((METRICS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(METRICS_DIR / pattern) for pattern in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    with (workdir / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield PrometheusAPI(port)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
