"""Roofline for ``bench speed``: each timed configuration's rate as a fraction of what the
machine reaches, measured in the same run.

The machine's two rates come from calibrating programs timed beside the methods: a dense
float32 matmul (the compute roof) and a large elementwise copy (the memory roof). A method's
counted work comes from XLA (:func:`spectral_jax.lra.bench.speed.slice_cost`): floating-point
operations and bytes accessed. Its arithmetic intensity (FLOP per byte) against the machine
balance (roof FLOP/s over roof bytes/s) says which roof applies (Williams, Waterman and
Patterson 2009, "Roofline: an insightful visual performance model"); the fraction is the
achieved rate over that roof. XLA's bytes are what its fused operations read and write, an
upper bound on memory traffic where caches hold reused operands, so a memory-bound fraction
is an upper bound too.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from spectral_jax import UsageError
from spectral_jax.lra.bench.memory import minor_page_faults


class MachineRates(NamedTuple):
    """The roofs measured in this run: GFLOP/s and GB/s (10⁹), with what measured them."""

    matmul_gflops: float  # a (size, size) @ (size, size) float32 matmul
    matmul_size: int
    thin_matmul_gflops: float  # (rows, head_dim) @ (head_dim, head_dim): a projection's shape
    thin_matmul_shape: tuple[int, int]
    copy_gbs: float  # read + write of a copy_mib float32 array, elementwise, in place
    copy_mib: int
    # Seconds the kernel takes per minor page fault (zero-filling a fresh 4 KiB page): the
    # same copy with a fresh output per call, less the in-place copy, over its faults; None
    # where the process cannot count its faults.
    fault_s: float | None = None

    @property
    def balance(self) -> float:
        """FLOP per byte at which the two roofs meet."""
        return self.matmul_gflops / self.copy_gbs


def _median_seconds(fn: Any, *args: Any, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compiles and warms
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def calibrate(*, matmul_size: int = 2048, thin_rows: int = 32768, head_dim: int = 64,
              copy_mib: int = 256, repeats: int = 5) -> MachineRates:
    """Times the calibrating matmuls and copy on the default device.

    Args:
      matmul_size: side of the square float32 matmul (2·size³ FLOP).
      thin_rows, head_dim: the thin matmul ``(thin_rows, head_dim) @ (head_dim, head_dim)``,
        the shape of a per-token projection (``n · heads`` rows).
      copy_mib: size of the float32 array read and written in place (``2 · copy_mib`` MiB
        moved per call).
      repeats: timed calls each; the median is used.

    Returns:
      :class:`MachineRates`.

    Raises:
      spectral_jax.UsageError: a size or ``repeats`` below 1.

    Example:
      >>> from spectral_jax.lra.bench.roofline import calibrate
      >>> rates = calibrate(matmul_size=64, thin_rows=256, head_dim=8, copy_mib=1, repeats=1)
      >>> rates.matmul_gflops > 0 and rates.copy_gbs > 0
      True
    """
    for name, value in (("matmul_size", matmul_size), ("thin_rows", thin_rows),
                        ("head_dim", head_dim), ("copy_mib", copy_mib), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"calibrate: `{name}` must be a positive int; got {value!r}.")
    matmul = jax.jit(lambda a, b: a @ b)
    square = jnp.ones((matmul_size, matmul_size), jnp.float32)
    t_square = _median_seconds(matmul, square, square, repeats=repeats)
    thin, weight = jnp.ones((thin_rows, head_dim), jnp.float32), jnp.ones((head_dim, head_dim))
    t_thin = _median_seconds(matmul, thin, weight, repeats=repeats)
    # In place (the input donated): a fresh output each call would time the kernel
    # zero-filling its pages, not the memory (see speed_notes).
    scale = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    big = scale(jnp.ones((copy_mib * 2**20 // 4,), jnp.float32))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        big = jax.block_until_ready(scale(big))
        times.append(time.perf_counter() - start)
    t_copy = statistics.median(times)
    fault_s = None
    faults = minor_page_faults()
    if faults is not None:
        fresh = jax.jit(lambda x: x + 1.0)
        t_fresh = _median_seconds(fresh, big, repeats=repeats)
        faults = minor_page_faults()
        for _ in range(repeats):
            jax.block_until_ready(fresh(big))
        per_call = (minor_page_faults() - faults) / repeats
        fault_s = max(t_fresh - t_copy, 0.0) / per_call if per_call >= 1 else None
    return MachineRates(
        matmul_gflops=2 * matmul_size**3 / t_square / 1e9, matmul_size=matmul_size,
        thin_matmul_gflops=2 * thin_rows * head_dim**2 / t_thin / 1e9,
        thin_matmul_shape=(thin_rows, head_dim),
        copy_gbs=2 * copy_mib * 2**20 / t_copy / 1e9, copy_mib=copy_mib, fault_s=fault_s)


def add_roofline(records: Sequence[dict[str, Any]], rates: MachineRates) -> list[dict[str, Any]]:
    """Adds each timed, counted record's rates, its bound and its fraction of that bound.

    New keys (None where the record has no time or no count): ``gflops`` and ``gbs``
    (achieved, 10⁹/s), ``intensity`` (FLOP/byte), ``bound`` (``"compute"`` where the
    intensity is at least the machine balance, else ``"memory"``) and ``roof_fraction``
    (achieved FLOP/s over the matmul roof, or achieved bytes/s over the copy roof);
    ``fault_share``, the part of the time the kernel spent zero-filling fresh pages
    (``minor_faults_per_call · rates.fault_s``, at most 1), and ``roof_fraction_no_faults``,
    the fraction with that time taken out: what a caching allocator would give.

    ``no_overlap_ceiling`` is the ``roof_fraction`` a program would reach if its compute and
    its memory traffic never overlapped: with C the time of its FLOP at the matmul roof and M
    that of its bytes at the copy roof it would take C + M, so max(C, M) / (C + M), one half
    at the balance. It is a reference, not a limit (XLA:CPU runs some independent operations
    side by side). ``no_overlap_fraction`` is (C + M) over the measured time.

    Example:
      >>> from spectral_jax.lra.bench.roofline import MachineRates, add_roofline
      >>> rates = MachineRates(100.0, 2048, 80.0, (1, 1), 10.0, 256)  # balance 10 FLOP/B
      >>> [r["bound"] for r in add_roofline(
      ...     [{"gflop": 50.0, "gbyte": 1.0, "time_s": 1.0},
      ...      {"gflop": 5.0, "gbyte": 5.0, "time_s": 1.0}], rates)]
      ['compute', 'memory']
      >>> [round(r["no_overlap_ceiling"], 3) for r in add_roofline(
      ...     [{"gflop": 50.0, "gbyte": 1.0, "time_s": 1.0}], rates)]  # C 0.5 s, M 0.1 s
      [0.833]
    """
    out = []
    for r in records:
        r = dict(r, gflops=None, gbs=None, intensity=None, bound=None, roof_fraction=None,
                 fault_share=None, roof_fraction_no_faults=None, no_overlap_ceiling=None,
                 no_overlap_fraction=None)
        if r.get("time_s") and r.get("gflop") and r.get("gbyte"):
            r["gflops"], r["gbs"] = r["gflop"] / r["time_s"], r["gbyte"] / r["time_s"]
            r["intensity"] = r["gflop"] / r["gbyte"]
            compute = r["intensity"] >= rates.balance
            r["bound"] = "compute" if compute else "memory"
            r["roof_fraction"] = (r["gflops"] / rates.matmul_gflops if compute
                                  else r["gbs"] / rates.copy_gbs)
            at_compute_roof = r["gflop"] / rates.matmul_gflops
            at_memory_roof = r["gbyte"] / rates.copy_gbs
            no_overlap = at_compute_roof + at_memory_roof
            r["no_overlap_ceiling"] = max(at_compute_roof, at_memory_roof) / no_overlap
            r["no_overlap_fraction"] = no_overlap / r["time_s"]
            if rates.fault_s is not None and r.get("minor_faults_per_call") is not None:
                share = min(r["minor_faults_per_call"] * rates.fault_s / r["time_s"], 1.0)
                r["fault_share"] = share
                r["roof_fraction_no_faults"] = (r["roof_fraction"] / (1 - share)
                                                if share < 1 else None)
        out.append(r)
    return out


def markdown(records: Sequence[dict[str, Any]], rates: MachineRates, title: str) -> str:
    """The roofline table of :func:`add_roofline` records as markdown, roofs first.

    Example:
      >>> from spectral_jax.lra.bench.roofline import MachineRates, markdown
      >>> text = markdown([], MachineRates(100.0, 2048, 80.0, (8, 4), 10.0, 256), "t")
      >>> text.splitlines()[2].endswith("balance 10.0 FLOP/byte.")
      True
    """
    rows, cols = rates.thin_matmul_shape
    lines = [
        f"# {title}", "",
        f"Roofs measured in this run: {rates.matmul_gflops:.1f} GFLOP/s "
        f"(({rates.matmul_size})² float32 matmul), {rates.thin_matmul_gflops:.1f} GFLOP/s "
        f"(({rows} × {cols}) @ ({cols} × {cols}) matmul), {rates.copy_gbs:.1f} GB/s "
        f"(in-place copy of {rates.copy_mib} MiB); balance {rates.balance:.1f} FLOP/byte"
        + ("" if rates.fault_s is None else
           f"; {1e6 * rates.fault_s:.2f} µs per page fault (the copy to a fresh output)")
        + ".", "",
        "| n | method | mode | ms | GFLOP | GB | FLOP/byte | GFLOP/s | GB/s | bound "
        "| of roof | without overlap at most | of no-overlap bound | page-fault time "
        "| of roof without it |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        if r.get("roof_fraction") is None:
            continue
        lines.append(
            f"| {r['length']} | {r['method']} | {r['mode']} | {1e3 * r['time_s']:.1f} "
            f"| {r['gflop']:.2f} | {r['gbyte']:.3f} | {r['intensity']:.1f} "
            f"| {r['gflops']:.1f} | {r['gbs']:.2f} | {r['bound']} "
            f"| {100 * r['roof_fraction']:.1f}% | {_percent(r.get('no_overlap_ceiling'))} "
            f"| {_percent(r.get('no_overlap_fraction'))} | {_percent(r['fault_share'])} "
            f"| {_percent(r['roof_fraction_no_faults'])} |")
    return "\n".join(lines) + "\n"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def write_markdown(path: str, records: Sequence[dict[str, Any]], rates: MachineRates,
                   title: str) -> str:
    """Writes :func:`markdown` to ``path`` (creating its folder) and returns the text."""
    text = markdown(records, rates, title)
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return text
