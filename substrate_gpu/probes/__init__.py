"""Detecting live CUDA contexts in a sandbox before checkpointing it.

``api`` holds the contract (:class:`CudaContextProbe`, :class:`GpuClient`); ``fd_scan``
the default probe, which reads ``/proc/<pid>/fd`` of the sandbox's processes.
"""

from __future__ import annotations

from substrate_gpu.probes.api import CudaContextProbe, GpuClient
from substrate_gpu.probes.fd_scan import DEFAULT_DEVICE_PATTERN, FdScanProbe

__all__ = ["DEFAULT_DEVICE_PATTERN", "CudaContextProbe", "FdScanProbe", "GpuClient"]
