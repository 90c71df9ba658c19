"""The WorkerPool controller (``substrate-gpu controller``): pools in, worker Deployments out.

Module map:

- :mod:`.reconcile`: pure decisions: the Deployment a pool wants, or why it is rejected,
  and the status the user reads;
- :mod:`.credentials`: the start-up check of the credentials (fatal refusals, waited-for
  outages) before kopf takes over;
- :mod:`.kube`: the Deployment API calls (server-side apply, owned delete);
- :mod:`.operator`: the kopf handlers and settings that tie them to the API server;
- :mod:`.pool_client`: WorkerPools from Python (create, apply, replace, get, list, delete,
  watch), validated as ``pool validate`` validates them, errors naming the pool.

See ``docs/api-guide.md`` ("Running the controller", "WorkerPools from Python").
"""

from __future__ import annotations

from substrate_gpu.controller.operator import ControllerOptions, run_controller
from substrate_gpu.controller.pool_client import PoolClient, StoredPool, connect
from substrate_gpu.controller.reconcile import Apply, Reject, plan, pool_status

__all__ = [
    "Apply",
    "ControllerOptions",
    "PoolClient",
    "Reject",
    "StoredPool",
    "connect",
    "plan",
    "pool_status",
    "run_controller",
]
