"""The standalone agent process (``substrate-gpu agent``).

Where things live: :mod:`.config` is the process's configuration as a value;
:mod:`.protocol` the JSON-lines request/response protocol (pure); :mod:`.wiring` builds the
production collaborators (runsc driver, fd probe, GPU injector, metrics); :mod:`.recovery`
opens the event log, recovering from it first; :mod:`.door` takes events in and gives
answers out (:class:`AgentService`), for the JSON lines of :mod:`.lines` (Unix socket,
stdin) and the worker API of :mod:`.worker_api`; :mod:`.server` runs it all (signals,
drain). ``agent --demo``'s simulated node and scripted workload live in
:mod:`substrate_gpu.testing.demo`. See ``docs/agent.md``.
"""

from __future__ import annotations

from substrate_gpu.service.config import AgentConfig
from substrate_gpu.service.door import AgentService
from substrate_gpu.service.server import Components, Running, run, running_agent

__all__ = ["AgentConfig", "AgentService", "Components", "Running", "run", "running_agent"]
