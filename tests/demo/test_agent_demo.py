"""``substrate-gpu agent --demo``: what docker-compose runs, scraped and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from observability.prometheus_server import free_port
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_agent_demo_loops_actors_through_their_lives_and_stops_cleanly(tmp_path):
    """Metrics show refusals and deleted actors after a round; SIGTERM exits 0 and cleans up."""
    port = free_port()
    stderr = (tmp_path / "agent.stderr").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "substrate_gpu",
            "agent",
            "--demo",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=REPO,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "agent.stderr").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            if _sample(text, "substrate_gpu_actors", state="deleted") >= 3:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no demo round completed:\n{text}")
        # Refused by the agent's probe, or attempted and refused by runsc (the route chosen).
        refused = _sample(
            text, "substrate_gpu_checkpoint_refusals_total", reason="live_cuda_context"
        )
        runsc_refused = _sample(
            text, "substrate_gpu_checkpoint_failures_total", reason="live_nvproxy_clients"
        )
        assert refused + runsc_refused >= 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=40) == 0, (tmp_path / "agent.stderr").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.close()
    assert "runtime:" in (tmp_path / "agent.stderr").read_text()
