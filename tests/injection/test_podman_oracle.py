"""Our injection against the CDI reference implementation (podman's embedded CDI library).

``podman create --device <kind>=all`` + ``podman init`` writes the OCI config the reference
library produces for a spec in /etc/cdi. For the same spec and host, our device nodes,
cgroup rules and mounts must match it. podman 4.3's library accepts cdiVersion ≤ 0.6.0;
the toolkit stand-in writes 0.5.0, as nvidia-ctk does for this content. Hooks and env are
*meant* to differ (allowlist; NVIDIA_VISIBLE_DEVICES dropped; LD_LIBRARY_PATH) and are
compared for exactly those differences.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from support.real import missing

from substrate_gpu import cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

pytestmark = pytest.mark.runc

KIND = "substrate-oracle.example/gpu"
CDI_DIR = Path("/etc/cdi")


@pytest.fixture(scope="module")
def podman(require_root, tmp_path_factory) -> list[str]:
    """podman with private, throw-away storage, and a busybox image imported into it."""
    binary = shutil.which("podman")
    if binary is None:
        missing("podman", "is not installed")
    state = tmp_path_factory.mktemp("podman")
    cmd = [
        binary,
        "--root",
        str(state / "root"),
        "--runroot",
        str(state / "run"),
        "--storage-driver",
        "vfs",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "none",
    ]
    rootfs = state / "image"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(bundles.find_busybox(), rootfs / "bin" / "busybox")
    tar = subprocess.run(
        ["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True
    ).stdout
    subprocess.run(
        [*cmd, "import", "-", "localhost/substrate-oracle:latest"],
        input=tar,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return cmd


def reference_config(podman: list[str], spec: dict[str, object]) -> dict:
    """The OCI config podman's CDI library writes for ``spec``."""
    name = f"substrate-oracle-{uuid.uuid4().hex[:10]}"
    spec_file = CDI_DIR / f"{name}.json"
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps(spec))
    try:
        subprocess.run(
            [
                *podman,
                "create",
                "--device",
                f"{KIND}=all",
                "--name",
                name,
                "localhost/substrate-oracle:latest",
                "sh",
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )
        # init writes config.json, then fails running the toolkit's hooks (absent here): fine.
        subprocess.run([*podman, "init", name], capture_output=True, check=False, timeout=120)
        container_id = subprocess.run(
            [*podman, "inspect", "-f", "{{.Id}}", name], capture_output=True, text=True, check=True
        ).stdout.strip()
        storage = Path(podman[podman.index("--root") + 1])
        return json.loads(
            (storage / "vfs-containers" / container_id / "userdata" / "config.json").read_text()
        )
    finally:
        subprocess.run([*podman, "rm", "-f", name], capture_output=True, check=False)
        spec_file.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "toolkit_version",
    [
        pytest.param("1.17.8", id="numbers-from-host-stat"),
        pytest.param("1.20.0", id="numbers-in-spec"),
    ],
)
def test_devices_rules_and_mounts_match_the_reference(podman, tmp_path, toolkit_version):
    """Same spec, same host: same device nodes, cgroup allow rules and mounts as the reference."""
    sim = node_.build_node(tmp_path / "node", gpus=(0, 2))
    out = tmp_path / "spec.json"
    subprocess.run(
        [
            str(sim.toolkit_dir / "nvidia-ctk"),
            "cdi",
            "generate",
            "--format=json",
            f"--dev-root={sim.root}",
            f"--library-search-path={sim.lib64}",
            f"--output={out}",
        ],
        env={
            **os.environ,
            "NVIDIA_CTK_STANDIN_VERSION": toolkit_version,
            "PATH": f"{sim.driver_root}/bin:{os.environ['PATH']}",
        },
        check=True,
    )
    spec = json.loads(out.read_text())
    spec["kind"] = KIND
    reference = reference_config(podman, spec)

    bundle = bundles.make_bundle(
        tmp_path / "bundle", ["sh"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    )
    ours_edits = cdi.edits_for_all(cdi.parse_spec(json.dumps(spec)))
    bundle_.inject_gpu(
        bundle,
        ours_edits,
        options=bundle_.InjectionOptions(
            driver_root=str(sim.driver_root), toolkit_dir=sim.toolkit_dir
        ),
        soname_cache=SonameCache(),
    )
    ours = json.loads((bundle / "config.json").read_text())

    def devices(config):
        return sorted(
            (d["path"], d["type"], d["major"], d["minor"]) for d in config["linux"]["devices"]
        )

    def rules(config):
        return sorted(
            (r["type"], r["major"], r["minor"], r["access"])
            for r in config["linux"]["resources"]["devices"]
            if r.get("allow")
        )

    def gpu_mounts(config):
        return sorted(
            (m["destination"], m["source"], tuple(m.get("options", ())))
            for m in config["mounts"]
            if m["source"].startswith(str(sim.root))
        )

    assert devices(ours) == devices(reference)
    assert rules(ours) == rules(reference)
    assert gpu_mounts(ours) == gpu_mounts(reference)
    assert len(devices(ours)) == 5  # nvidia0, nvidia2, nvidiactl, nvidia-uvm, nvidia-uvm-tools

    # The intended differences: the reference keeps NVIDIA_VISIBLE_DEVICES and every hook.
    assert "NVIDIA_VISIBLE_DEVICES=void" in reference["process"]["env"]
    assert not [e for e in ours["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(reference["hooks"]["createContainer"]) == 5
    assert [h["args"][1] for h in ours["hooks"]["createContainer"]] == [
        "create-symlinks",
        "enable-cuda-compat",
    ]
