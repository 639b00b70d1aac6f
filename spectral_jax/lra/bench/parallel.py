"""``bench parallel``: per-device memory and collective traffic of a sequence split over devices.

For each method with a sequence-sharded form and each length n, one training-shaped call
(forward and the gradient of every input) is compiled twice: the plain function on one
device, and :func:`spectral_jax.parallel.sequence_parallel` on a mesh of ``devices`` with
query, key and value split along the length. Nothing runs: the per-device peak memory comes
from XLA's buffer assignment (:func:`spectral_jax.lra.compiled.peak_bytes`) and the traffic
from the collectives of the compiled HLO (:func:`spectral_jax.lra.compiled.collectives`),
both load-free counts. On simulated CPU devices these measure memory and traffic, not speed.

The longest sequence that fits ``memory_budget_bytes`` per device is found by doubling n
from the smallest length until the compiled peak no longer fits, on one device and on the
mesh.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from rich.table import Table

from spectral_jax import UsageError
from spectral_jax.attention import ATTENTIONS, get_attention_spec
from spectral_jax.lra.bench.report import method_styles
from spectral_jax.lra.compiled import collectives, peak_bytes
from spectral_jax.lra.plotting import log_length_axes, save_figure, side_by_side
from spectral_jax.parallel import sequence_parallel


def sharded_methods() -> list[str]:
    """The registered methods with a sequence-sharded form, in registry order."""
    return [name for name, spec in ATTENTIONS.items() if spec.sequence_parallel is not None]


def compile_call(method: str, length: int, devices: int, *, batch: int = 1, heads: int = 1,
                 head_dim: int = 64, budget: int | None = None) -> jax.stages.Compiled:
    """The compiled forward and input gradients of one call on ``devices`` devices.

    ``devices == 1`` compiles the plain function; otherwise ``sequence_parallel`` on a mesh
    of the first ``devices`` devices, with the inputs' length axis split over it (so each
    device's arguments are its shard).
    """
    spec = get_attention_spec(method)
    kwargs = spec.call_kwargs(jax.random.key(0), budget=budget, length=length,
                              head_dim=head_dim)
    if devices == 1:
        fn, sharding = functools.partial(spec.fn, **kwargs), None
    else:
        mesh = jax.make_mesh((devices,), ("seq",), devices=jax.devices()[:devices],
                             axis_types=(AxisType.Explicit,))
        fn = sequence_parallel(method, mesh=mesh, **kwargs)
        sharding = NamedSharding(mesh, P(None, "seq", None, None))

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return fn(q, k, v).astype(jnp.float32).sum()

    x = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.float32, sharding=sharding)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile()


def measure(method: str, length: int, devices: int, **settings: Any) -> dict[str, Any]:
    """One record: per-device peak bytes and the collectives' elements and bytes per call."""
    compiled = compile_call(method, length, devices, **settings)
    found = collectives(compiled)
    return {"method": method, "length": length, "devices": devices,
            "peak_bytes": peak_bytes(compiled),
            "collective_bytes": sum(c.nbytes for c in found),
            "collective_elements": sum(c.size for c in found),
            "collective_kinds": sorted({c.kind for c in found})}


def max_length(method: str, devices: int, *, start: int, limit: int, memory_budget_bytes: int,
               known: dict[int, int] | None = None, **settings: Any) -> int | None:
    """The largest ``start · 2^k ≤ limit`` whose per-device peak fits the budget (None if
    not even ``start`` fits); ``known``: peaks already measured, by length."""
    best, n, known = None, start, known or {}
    while n <= limit:
        peak = known.get(n) or measure(method, n, devices, **settings)["peak_bytes"]
        if peak > memory_budget_bytes:
            break
        best, n = n, 2 * n
    return best


def run_parallel(methods: Sequence[str] | None, *, lengths: Sequence[int], devices: int = 8,
                 memory_budget_bytes: int, max_length_limit: int = 2**26,
                 progress: Callable[[str], None] = print, **settings: Any
                 ) -> dict[str, list[dict[str, Any]]]:
    """Records for every method and length on one device and on ``devices``, and each
    method's longest sequence under the budget.

    Returns:
      ``{"records": [...], "max_lengths": [...]}``; each record has ``memory_ratio``
      (per-device peak on the mesh / peak on one device at the same n).

    Raises:
      spectral_jax.UsageError: fewer than ``devices`` devices, or a method without a
        sequence-sharded form.
    """
    methods = list(sharded_methods() if methods is None else methods)
    unsharded = [m for m in methods if get_attention_spec(m).sequence_parallel is None]
    if unsharded:
        raise UsageError(f"bench parallel: {', '.join(unsharded)} has no sequence-sharded "
                         f"form; methods that shard: {', '.join(sharded_methods())}.")
    if jax.device_count() < devices:
        raise UsageError(
            f"bench parallel: `--devices`={devices} but JAX sees {jax.device_count()}; on "
            f"CPU the command simulates them (jax_num_cpu_devices) before JAX starts.")
    records, longest = [], []
    for method in methods:
        for length in lengths:
            one, many = (measure(method, length, p, **settings) for p in (1, devices))
            many["memory_ratio"] = many["peak_bytes"] / one["peak_bytes"]
            records += [one, many]
            progress(f"{method:16s} n={length:8d}  1 device {one['peak_bytes'] / 2**20:10.1f} "
                     f"MiB  {devices} devices {many['peak_bytes'] / 2**20:9.1f} MiB each "
                     f"({many['memory_ratio']:.3f})  {many['collective_bytes']:9d} B moved")
        fits = {p: max_length(method, p, start=min(lengths), limit=max_length_limit,
                              memory_budget_bytes=memory_budget_bytes,
                              known={r["length"]: r["peak_bytes"] for r in records
                                     if r["method"] == method and r["devices"] == p},
                              **settings)
                for p in (1, devices)}
        longest.append({"method": method, "devices": devices, "max_length_1": fits[1],
                        "max_length_p": fits[devices],
                        "growth": (fits[devices] / fits[1]) if fits[1] and fits[devices]
                        else None})
        progress(f"{method:16s} longest under {memory_budget_bytes / 2**20:.1f} MiB: "
                 f"{fits[1]} on 1 device, {fits[devices]} on {devices}")
    return {"records": records, "max_lengths": longest}


def parallel_table(result: dict[str, list[dict[str, Any]]], title: str) -> Table:
    """Per-device peak on one device and on the mesh, their ratio, and bytes moved."""
    table = Table(title=title)
    for column in ("method", "n", "1 device MiB", "per device MiB", "ratio", "bytes moved",
                   "collectives"):
        table.add_column(column, justify="left" if column in ("method", "collectives")
                         else "right")
    ones = {(r["method"], r["length"]): r for r in result["records"] if r["devices"] == 1}
    for r in result["records"]:
        if r["devices"] == 1:
            continue
        one = ones[(r["method"], r["length"])]
        table.add_row(r["method"], str(r["length"]), f"{one['peak_bytes'] / 2**20:.1f}",
                      f"{r['peak_bytes'] / 2**20:.1f}", f"{r['memory_ratio']:.3f}",
                      str(r["collective_bytes"]), ", ".join(r["collective_kinds"]))
    return table


def markdown(result: dict[str, list[dict[str, Any]]], *, title: str, command: str) -> str:
    """The committed table: memory and traffic per length, then the longest lengths."""
    ones = {(r["method"], r["length"]): r for r in result["records"] if r["devices"] == 1}
    lines = [f"# {title}", "", f"Command: `{command}`", "",
             "| method | n | peak, 1 device (MiB) | peak per device (MiB) | ratio | "
             "collective bytes per call |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["records"]:
        if r["devices"] > 1:
            one = ones[(r["method"], r["length"])]
            lines.append(f"| {r['method']} | {r['length']} | {one['peak_bytes'] / 2**20:.1f} "
                         f"| {r['peak_bytes'] / 2**20:.1f} | {r['memory_ratio']:.3f} | "
                         f"{r['collective_bytes']} |")
    lines += ["", "| method | longest n, 1 device | longest n, mesh | growth |",
              "|---|---:|---:|---:|"]
    for r in result["max_lengths"]:
        growth = "—" if r["growth"] is None else f"{r['growth']:.0f}×"
        lines.append(f"| {r['method']} | {r['max_length_1']} | {r['max_length_p']} | "
                     f"{growth} |")
    return "\n".join(lines) + "\n"


def plot_parallel(result: dict[str, list[dict[str, Any]]], path: str | pathlib.Path,
                  title: str = "") -> pathlib.Path | None:
    """Per-device peak memory on the mesh as a fraction of one device's, and the bytes moved
    per call, against n, one line per method. Returns the path written, or None when
    matplotlib is missing."""
    path = pathlib.Path(path)
    panels = side_by_side(path, figsize=(12, 5.6))
    if panels is None:
        return None
    fig, ax_m, ax_c = panels
    mesh = [r for r in result["records"] if r["devices"] > 1]
    for method, style in method_styles([r["method"] for r in mesh]).items():
        pts = sorted((r["length"], r) for r in mesh if r["method"] == method)
        ax_m.plot([n for n, _ in pts], [r["memory_ratio"] for _, r in pts], label=method,
                  **style)
        ax_c.plot([n for n, _ in pts], [max(r["collective_bytes"], 1) for _, r in pts],
                  **style)
    devices = mesh[0]["devices"] if mesh else 0
    log_length_axes([(ax_m, f"peak per device, {devices} devices / 1 device"),
                     (ax_c, "collective bytes per call")])
    ax_m.set_yscale("linear")
    ax_m.axhline(1 / devices if devices else 0, color="grey", linewidth=0.8, linestyle=":")
    fig.legend(loc="lower center", ncol=8, fontsize=7, frameon=False)
    return save_figure(fig, path, title, bottom=0.12)
