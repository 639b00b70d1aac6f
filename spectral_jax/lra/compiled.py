"""Memory, operation and collective counts of a compiled JAX program, read from XLA.

Shared by the benchmarks (which skip what would not fit) and training runs (which record their
train step's peak), so both report the same figure.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

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


# One collective of an HLO module: `%x = f32[2,8]{1,0} all-reduce(...)`, or a tuple result
# `%x = (f32[8]{0}, s32[]) all-reduce-start(...)`; the `-done` halves are not counted again.
_COLLECTIVE = re.compile(
    r"=\s*(\([^)]*\)|\S+)\s+(all-reduce|all-gather|collective-permute|all-to-all|"
    r"reduce-scatter)(?:-start)?\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s")
_WHILE = re.compile(r"\swhile\(.*body=%([\w.\-]+).*\"known_trip_count\":\{\"n\":\"(\d+)\"")
_CALLED = re.compile(r"(?:calls|body|branch_computations)=\{?%([\w.\-]+(?:,\s*%[\w.\-]+)*)")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
             "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


class Collective(NamedTuple):
    """One array of a collective's result in a compiled program, and how often it runs."""

    kind: str  # all-reduce, all-gather, collective-permute, all-to-all or reduce-scatter
    dtype: str  # HLO element type: f32, s32, pred, ...
    shape: tuple[int, ...]
    count: int = 1  # executions per call: the trip counts of the loops around it

    @property
    def size(self) -> int:
        """Elements per call of the program (every execution)."""
        return math.prod(self.shape) * self.count

    @property
    def nbytes(self) -> int:
        """Bytes per call of the program (every execution)."""
        return self.size * _ITEMSIZE.get(self.dtype, 4)


def collectives(compiled: jax.stages.Compiled) -> list[Collective]:
    """Every collective of a compiled program, one entry per array of its result.

    Read from the optimised HLO (``compiled.as_text()``), so what XLA combined or removed is
    counted as it runs: a load-free count of what crosses devices per call. A collective
    inside a loop (a ``jax.lax.scan``) counts once per iteration, from the loop's known trip
    count (once where XLA does not know it).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import PartitionSpec as P
      >>> from spectral_jax.lra.compiled import collectives
      >>> mesh = jax.make_mesh((2,), ("seq",), devices=jax.devices()[:2])
      >>> total = jax.shard_map(lambda x: jax.lax.psum(x.sum(0), "seq"), mesh=mesh,
      ...                       in_specs=P("seq"), out_specs=P())
      >>> x = jax.ShapeDtypeStruct((8, 3), jnp.float32,
      ...                          sharding=jax.NamedSharding(mesh, P("seq")))
      >>> [(c.kind, c.shape) for c in collectives(jax.jit(total).lower(x).compile())]
      [('all-reduce', (3,))]
    """
    found: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}
    calls: dict[str, list[tuple[str, int]]] = {}
    entry = current = ""
    for line in compiled.as_text().splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            entry = current if line.startswith("ENTRY") else entry
            continue
        loop = _WHILE.search(line)
        called = {} if loop is None else {loop.group(1): int(loop.group(2))}
        for names in _CALLED.findall(line):
            for name in re.findall(r"[\w.\-]+", names):
                called.setdefault(name, 1)
        calls.setdefault(current, []).extend(called.items())
        for result, kind in _COLLECTIVE.findall(line):
            for dtype, dims in _ARRAY.findall(result):
                found.setdefault(current, []).append(
                    (kind, dtype, tuple(int(d) for d in dims.split(",") if d)))
    runs: dict[str, int] = {}

    def visit(name: str, times: int) -> None:
        runs[name] = runs.get(name, 0) + times
        for callee, trips in calls.get(name, ()):
            visit(callee, times * trips)

    visit(entry, 1)
    return [Collective(kind, dtype, shape, runs.get(name, 1))
            for name, items in found.items() for kind, dtype, shape in items]
