"""How much memory a compiled benchmark needs, and how much a benchmark may take.

Every configuration is compiled first and its peak read from XLA's buffer assignment, so what
would not fit is skipped before it runs (and before it can be killed for memory).
"""

from __future__ import annotations

import os

import jax

from spectral_jax.lra.compiled import peak_bytes

__all__ = ["ACCELERATOR_SAFETY_FACTOR", "CPU_SAFETY_FACTOR", "default_memory_budget_bytes",
           "minor_page_faults", "peak_bytes"]

# XLA's CPU buffer assignment undercounts what its runtime really holds (exact attention's
# forward+backward at long lengths needs about twice its predicted peak), so on CPU only half
# of the available memory is offered to a configuration; GPU/TPU allocators follow the
# prediction closely.
CPU_SAFETY_FACTOR = 0.5
ACCELERATOR_SAFETY_FACTOR = 0.9


def _available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_memory_budget_bytes(device: jax.Device | None = None) -> int:
    """The memory a benchmark configuration may use, with a safety margin.

    Args:
      device: the device to run on; default ``jax.devices()[0]``.

    Returns:
      Bytes: 0.9 × ``memory_stats()["bytes_limit"]`` on GPU/TPU, else 0.5 × the host's
      available memory (``MemAvailable``, or total RAM where /proc/meminfo is missing),
      because XLA's CPU estimate undercounts the runtime's allocations (see
      ``CPU_SAFETY_FACTOR``).

    Example:
      >>> from spectral_jax.lra.bench.speed import default_memory_budget_bytes
      >>> default_memory_budget_bytes() > 2**20
      True
    """
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(ACCELERATOR_SAFETY_FACTOR * stats["bytes_limit"])
    return int(CPU_SAFETY_FACTOR * _available_host_bytes())


def minor_page_faults() -> int | None:
    """The process's minor page faults so far (None where ``resource`` is missing: Windows).

    On CPU, XLA allocates each call's scratch buffer afresh; where the allocator maps a large
    one anew, the kernel zero-fills its pages on first touch on every call, which shows here
    and in the time (see benchmarks/README.md).
    """
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
