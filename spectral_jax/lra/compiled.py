"""Memory and operation counts of a compiled JAX program, read from XLA's analyses.

Shared by the benchmarks (which skip what would not fit) and training runs (which record their
train step's peak), so both report the same figure.
"""

from __future__ import annotations

import jax

from spectral_jax import UnsupportedError


def peak_bytes(compiled: jax.stages.Compiled) -> int:
    """Peak device memory of a compiled function from XLA's buffer assignment.

    Arguments + outputs + temporaries − aliased bytes; ``peak_memory_in_bytes`` when XLA
    reports a larger value (on CPU it counts only arguments and outputs).

    Args:
      compiled: ``jax.jit(f).lower(...).compile()``.

    Returns:
      Bytes, an int.

    Raises:
      spectral_jax.UnsupportedError: the backend gives no memory analysis.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.lra.compiled import peak_bytes
      >>> c = jax.jit(lambda x: x @ x).lower(jnp.ones((256, 256))).compile()
      >>> peak_bytes(c) >= 2 * 256 * 256 * 4
      True
    """
    stats = compiled.memory_analysis()
    if stats is None:
        raise UnsupportedError(
            f"memory_analysis() is not available on backend {jax.default_backend()!r}."
        )
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    return int(max(total, getattr(stats, "peak_memory_in_bytes", 0)))


def compiled_cost(compiled: jax.stages.Compiled) -> tuple[float, float]:
    """A compiled program's XLA floating-point operations and bytes accessed, in units of 10⁹.

    ``cost_analysis()`` gives a dict, a one-element list of it on older JAX, or None where
    the backend has no analysis (then both counts are 0).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.lra.compiled import compiled_cost
      >>> c = jax.jit(lambda x: x @ x).lower(jnp.ones((64, 64))).compile()
      >>> compiled_cost(c)[0] >= 2 * 64 ** 3 / 1e9
      True
    """
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    return float(cost.get("flops", 0.0)) / 1e9, float(cost.get("bytes accessed", 0.0)) / 1e9
