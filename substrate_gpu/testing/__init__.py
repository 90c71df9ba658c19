"""The public test kit: a simulated GPU node, tool stand-ins and an in-process sandbox runtime.

What kopf ships as ``kopf.testing`` and structlog as ``structlog.testing``: pieces for testing
code built on substrate-gpu where a GPU, the NVIDIA toolkit or gVisor cannot run. Production
modules never import this package (``tests/test_import_graph.py`` walks the import graph);
the test suite, the benchmarks and the demo do. The demo lives here, :mod:`.demo`, because
it runs on the kit; the CLI reaches it only inside the handlers of ``demo`` and
``agent --demo``.

- :mod:`.demo`: ``substrate-gpu demo``, the simulated node's actors through their whole life.
- :mod:`.node`: a simulated node under a directory (char device nodes, real gcc-built ELF
  driver libraries, the toolkit stand-ins installed as scripts).
- :mod:`.bundles`: OCI bundles with a static busybox rootfs.
- :mod:`.nvidia_ctk`, :mod:`.nvidia_cdi_hook`, :mod:`.runsc`: stand-ins for the real tools,
  runnable with ``python -m``; they reproduce the documented command lines, output shapes and
  failure modes (see docs/gpu-injection.md, "Stand-ins", and tests/standins/README.md), and
  are not mocks of our code. The runsc stand-in runs every sandbox as a real runc container.
- :mod:`.kube`: a real etcd + kube-apiserver on 127.0.0.1 (built by scripts/build-kube.sh),
  for the WorkerPool tests and the controller's local quick start (docs/api-guide.md).
- :mod:`.sandboxes`: :class:`~.sandboxes.SimulatedSandboxes`, an in-process runsc and CUDA
  context probe for machines without runc.
- :mod:`.atelet`: :class:`~.atelet.FakeAtelet`, atelet's worker-support service as a real
  gRPC server over mutual TLS, for the agent's capacity report, and
  :class:`~.atelet.SilentAtelet`, a peer on its socket that accepts and never answers.
"""
