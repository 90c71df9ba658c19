"""Read pool files and write manifests: YAML in (multi-document, errors with lines), YAML out.

Also owns the manifests checked in under ``deploy/``: the CRD, the controller and the
example pools' worker Deployments, all generated here (:func:`deploy_files`) so a test can
prove the checked-in copies are not stale.

There is no node-agent DaemonSet: the agent runs in each GPU worker's ``ateom`` container
(:mod:`.worker_agent`), where the device plugin puts the pool's GPUs. The node-level role
(upstream's atelet: driving workers, restoring actors on GPU nodes) is upstream's own
DaemonSet, not ours; ``docs/api-guide.md`` says what it needs on GPU nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from substrate_gpu import _yaml
from substrate_gpu.exceptions import ConfigError
from substrate_gpu.pools import crd, model, shaping, validation

__all__ = [
    "AGENT_NAMESPACE",
    "EXAMPLE_SETTINGS",
    "PoolDocument",
    "PoolFileError",
    "PoolYamlError",
    "controller_manifests",
    "deploy_files",
    "dump_documents",
    "parse_documents",
    "read_documents",
]

AGENT_NAMESPACE = "substrate-system"
"""The controller's namespace (created by ``deploy/controller.yaml``)."""

CONTROLLER_NAME = "substrate-gpu-controller"
CONTROLLER_HEALTH_PORT = 8080

EXAMPLE_SETTINGS = shaping.ControllerSettings()
"""Controller settings of the checked-in manifests: the defaults, an empty environment. So
``deploy/rendered/X.yaml`` is what ``substrate-gpu pool render deploy/examples/X.yaml``
prints in a plain shell (no ``ATE_*`` variable set, no flag), and ``deploy/controller.yaml``
sets no worker image: GPU pools get the built-in ``substrate-gpu:<version>``."""


class PoolFileError(ConfigError):
    """A pool file cannot be read."""


class PoolYamlError(PoolFileError):
    """A pool file is not valid YAML (the message names file, line and column)."""


@dataclass(frozen=True)
class PoolDocument:
    """One YAML document of a file, with where it starts (for messages)."""

    source: str
    """``FILE`` for a single document, ``FILE#N`` (1-based) in a multi-document file."""
    line: int
    """1-based line where the document starts."""
    content: object
    """The parsed document."""


def parse_documents(text: str, source: str) -> list[PoolDocument]:
    """Every non-empty document of ``text``; YAML errors name ``source``, line and column."""
    docs: list[tuple[int, object]] = []
    loader: _yaml.SafeLoader | None = None
    try:
        # Built inside the try: the C loader reads (and refuses, say, a NUL byte) at once.
        loader = _yaml.SafeLoader(text)
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # pragma: no cover - check_node promised one
                break
            content = loader.construct_document(node)
            if content is not None:  # an empty document between two `---`
                docs.append((node.start_mark.line + 1, content))
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, say)
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise PoolYamlError(
            f"while reading {source}:{line}:{column}: invalid YAML: character"
            f" {chr(e.character) if isinstance(e.character, int) else e.character!r}"
            " is not allowed in YAML; fix the file and retry"
        ) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = " ".join((getattr(e, "problem", None) or str(e)).split())
        raise PoolYamlError(
            f"while reading {where}: invalid YAML: {problem}; fix the file and retry"
        ) from e
    except RecursionError as e:
        raise PoolYamlError(
            f"while reading {source}: invalid YAML: nested too deeply for a pool file;"
            " fix the file and retry"
        ) from e
    finally:
        if loader is not None:
            loader.dispose()
    if len(docs) == 1:
        return [PoolDocument(source, docs[0][0], docs[0][1])]
    return [PoolDocument(f"{source}#{i}", line, c) for i, (line, c) in enumerate(docs, 1)]


def read_documents(path: Path) -> list[PoolDocument]:
    """Read and parse one pool file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PoolFileError(f"while reading pool file {path}: {e}") from e
    return parse_documents(text, str(path))


class _PlainDumper(_yaml.SafeDumper):
    """Never writes anchors and aliases (``&id001``): manifests are read by people.

    libyaml's emitter: much faster than the pure-Python one, same bytes (``pool crd``:
    tests/bench/README.md, "Figures behind design choices")."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def dump_documents(documents: Iterable[Mapping[str, object]]) -> str:
    """Multi-document YAML, ready for ``kubectl apply -f -``."""
    return yaml.dump_all(
        [dict(d) for d in documents],
        Dumper=_PlainDumper,
        sort_keys=False,
        explicit_start=True,
        width=100,
    )


def _controller_rules() -> list[dict[str, object]]:
    """Least privilege: what ``substrate-gpu controller`` calls, and nothing else."""
    return [
        # kopf lists and watches pools, and patches them: its bookkeeping annotations
        # and the finalizer that holds a pool until its workers are deleted.
        {
            "apiGroups": [model.API_GROUP],
            "resources": [crd.PLURAL],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {
            "apiGroups": [model.API_GROUP],
            "resources": [f"{crd.PLURAL}/status"],
            "verbs": ["get", "patch"],
        },
        # blockOwnerDeletion on the Deployment's owner reference needs this where the
        # OwnerReferencesPermissionEnforcement admission plugin is on.
        {
            "apiGroups": [model.API_GROUP],
            "resources": [f"{crd.PLURAL}/finalizers"],
            "verbs": ["update"],
        },
        # Worker Deployments: server-side apply (create or patch), read and delete.
        # No list or watch: the controller addresses them by name only.
        {
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "verbs": ["get", "create", "patch", "delete"],
        },
        # kopf reports handler outcomes as Events on the pool (kubectl describe).
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # kopf watches CRDs so it notices the WorkerPool CRD installed after it started.
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
    ]


def controller_image() -> str:
    """The controller's image: this project's, ``substrate-gpu:<version>`` (the Dockerfile's
    default target, entrypoint ``substrate-gpu``), as GPU workers' by default."""
    return shaping.agent_image()


def controller_manifests(settings: shaping.ControllerSettings) -> list[dict[str, object]]:
    """The controller: its Namespace, ServiceAccount, ClusterRole and binding, and Deployment.

    One replica, replaced with ``Recreate``: kopf runs standalone (no peering), so two
    controllers must never overlap. The pod runs unprivileged, as non-root, read-only.
    """
    labels = {"app.kubernetes.io/name": CONTROLLER_NAME}
    env = [{"name": shaping.TOOLKIT_HOST_PATH_ENV, "value": settings.toolkit_host_path}]
    if settings.default_image is not None:
        env.append({"name": shaping.WORKER_IMAGE_ENV, "value": settings.default_image})
    if settings.driver_root is not None:
        env.append({"name": shaping.DRIVER_ROOT_ENV, "value": settings.driver_root})
    health = f"http://0.0.0.0:{CONTROLLER_HEALTH_PORT}/healthz"
    account = {"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": AGENT_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": CONTROLLER_NAME, "namespace": AGENT_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CONTROLLER_NAME},
            "rules": _controller_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CONTROLLER_NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": CONTROLLER_NAME,
            },
            "subjects": [account],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": CONTROLLER_NAME, "namespace": AGENT_NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": CONTROLLER_NAME,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "controller",
                                "image": controller_image(),
                                "args": [
                                    "--log-level",
                                    "INFO",
                                    "controller",
                                    "--liveness-endpoint",
                                    health,
                                ],
                                "env": env,
                                "ports": [
                                    {"name": "health", "containerPort": CONTROLLER_HEALTH_PORT}
                                ],
                                "livenessProbe": {
                                    "httpGet": {"path": "/healthz", "port": "health"},
                                    "periodSeconds": 30,
                                },
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "128Mi"},
                                    "limits": {"memory": "256Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                # Writable /tmp on a read-only root (a mount, not a file).
                                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108
                            }
                        ],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                },
            },
        },
    ]


def deploy_files(examples: Iterable[Path]) -> dict[str, str]:
    """The ``deploy/`` tree, file name to content, all generated.

    ``crd.yaml`` and ``controller.yaml`` install the system; ``examples/X.yaml`` are the
    example pools (apply them once the CRD is in); ``rendered/X.yaml`` are the worker
    Deployments ``substrate-gpu pool render`` prints for them (a GPU pool's runs the
    agent), for review.
    """
    files = {
        "crd.yaml": dump_documents([crd.render_crd()]),
        "controller.yaml": dump_documents(controller_manifests(EXAMPLE_SETTINGS)),
    }
    for path in sorted(examples):
        pools: list[Mapping[str, object]] = []
        deployments: list[Mapping[str, object]] = []
        for doc in read_documents(path):
            pool = validation.load_pool(doc.content, source=doc.source)
            pools.append(_as_mapping(doc.content))
            deployments.append(shaping.render_worker_deployment(pool, EXAMPLE_SETTINGS))
        files[f"examples/{path.name}"] = dump_documents(pools)
        files[f"rendered/{path.name}"] = dump_documents(deployments)
    return files


def _as_mapping(content: object) -> Mapping[str, object]:
    if not isinstance(content, Mapping):
        raise PoolFileError(f"a {model.KIND} document must be a mapping")
    return content
