"""How much of a CPU timing at long n is the allocator, not the computation.

Times a jitted function that only doubles three (1, n, 4, 64) float32 arrays, the shape of
`bench speed`'s q, k, v and of their gradients, and counts the process's minor page faults
per call. Its work is linear in n, so any growth beyond 4x from n = 4096 to 16384 is memory
the allocator handed back to the kernel and the kernel zero-filled again on the next call.

    python benchmarks/allocator_probe.py
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
        MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,retain:true \\
        python benchmarks/allocator_probe.py
"""

from __future__ import annotations

import resource
import time

import jax

CALLS = 20


def main() -> None:
    times = {}
    for n in (4096, 16384):
        q, k, v = jax.random.normal(jax.random.key(0), (3, 1, n, 4, 64))
        double = jax.jit(lambda q, k, v: (2 * q, 2 * k, 2 * v))
        jax.block_until_ready(double(q, k, v))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for _ in range(CALLS):
            jax.block_until_ready(double(q, k, v))
        times[n] = (time.perf_counter() - start) / CALLS
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / CALLS
        print(f"n={n}: {1e3 * times[n]:.2f} ms/call, {faults:,.0f} page faults/call")
    print(f"growth 4096 -> 16384: {times[16384] / times[4096]:.2f}x (the work grows 4x)")


if __name__ == "__main__":
    main()
