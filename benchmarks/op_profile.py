"""Where each method's forward+backward time goes, by kind of XLA operation.

The roofline (``bench speed --roofline``) says how far a method is from the machine's
rates; this says why. One profiled run of the program ``bench speed`` times (batch 1, 4
heads, head_dim 64, float32, forward + gradient w.r.t. q, k, v) is split by the compiled
HLO operation each trace event belongs to:

- ``matmul``: a ``dot`` or a fusion around one (XLA:CPU's YNNPACK ``kCustom`` fusions carry
  their elementwise producers and consumers with them, so a matmul fused with an ``exp``
  counts here); its FLOP are counted from the HLO shapes, 2 · output size · contraction;
- ``long matmul``: a matmul whose contraction is at least twice every output dimension, a
  reduction over the sequence into a small matrix (kᵀv, most weight-like gradients);
- ``elementwise``: fusions of arithmetic and reductions (exp, divisions, sums, maxima);
- ``data movement``: what only moves or fills memory (copies, transposes, broadcasts,
  dynamic slices and updates, concatenations, pads, gathers and scatters);
- the rest (loop bookkeeping, host transfers) under ``other``.

A dot whose trace event is shorter than its FLOP at the square matmul's rate ran
asynchronously (XLA:CPU hands some dots to its thread pool; the event is the launch and the
work lands on the operations traced after it): its time and FLOP are set aside as ``async``
rather than credited to a kind. The operations of one call may also overlap on XLA:CPU's
threads, so the traced total can exceed the wall time.

Each matmul kind's rate is set beside the traced duration of one product of its shape
(64 × 64 weights and n rows; 64 × n by n × 64), timed the same way. The no-overlap bound is
XLA's counted FLOP at the square matmul's rate plus its counted bytes at the copy's, one
after the other: a reference, not a limit, since operations can overlap. XLA counts the
all-heads program with nothing rematerialised; the profiled CPU program loops over heads and
rematerialises the forward pass, so it does more work than the count.

    python benchmarks/op_profile.py --methods softmax nystrom spectral_shift skyformer \\
        performer linear --length 8192 --layouts --out benchmarks/op_profile_cpu

Pause long background jobs while it runs: the trace measures wall time per operation.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention import get_attention_spec
from spectral_jax.lra.bench import methods as methods_lib
from spectral_jax.lra.bench import roofline
from spectral_jax.lra.bench.speed import benchmark_function, slice_cost

_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\w+\[([\d,]*)\]\S*) ([\w\-]+)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_MOVES = {"parameter", "constant", "bitcast", "broadcast", "copy", "transpose", "slice",
          "dynamic-slice", "dynamic-update-slice", "reshape", "concatenate", "pad", "gather",
          "scatter", "iota", "tuple", "get-tuple-element", "convert"}
KINDS = ("matmul", "long matmul", "elementwise", "data movement", "other", "async")
MATMULS = KINDS[:2]


def parse_hlo(text: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Instructions by name (shape, opcode, operands, called computation) and the
    instructions of each computation, from a compiled module's text."""
    instrs: dict[str, dict[str, Any]] = {}
    comps: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    current = None
    for line in text.splitlines():
        if not line.startswith(" "):
            m = _COMP.match(line)
            current = m.group(1) if m and line.rstrip().endswith("{") else current
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, _, dims, opcode, rest = m.groups()
        called = re.search(r"calls=%([\w.\-]+)", rest)
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
        operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        instr = {"name": name, "opcode": opcode,
                 "shape": [int(x) for x in (dims or "").split(",") if x],
                 "operands": operands, "calls": called.group(1) if called else None,
                 "contracting": ([int(x) for x in contracting.group(1).split(",") if x]
                                 if contracting else None)}
        instrs[name] = instr
        comps[current].append(instr)
    return instrs, comps


def _contraction(instr: dict[str, Any], shapes: dict[str, list[int]]) -> int:
    lhs = shapes.get(instr["operands"][0])
    dims = instr["contracting"] or []
    if lhs is None or any(i >= len(lhs) for i in dims):
        raise ValueError(f"dot {instr['name']}: unknown left operand shape {lhs}")
    return math.prod(lhs[i] for i in dims)


def _dot_flop(instr: dict[str, Any], shapes: dict[str, list[int]]) -> float:
    return 2.0 * math.prod(instr["shape"]) * _contraction(instr, shapes)


def _dot_kind(instr: dict[str, Any], shapes: dict[str, list[int]]) -> str:
    """"long matmul" where the contraction is at least twice every output dimension (a
    reduction over the sequence into a small matrix, e.g. kᵀv), else "matmul"."""
    long = _contraction(instr, shapes) >= 2 * max(instr["shape"] or [1])
    return "long matmul" if long else "matmul"


def classify(name: str, instrs: dict[str, dict[str, Any]],
             comps: dict[str, list[dict[str, Any]]]) -> tuple[str, float]:
    """(kind, FLOP of its matmuls) of one top-level operation."""
    instr = instrs.get(name)
    if instr is None:
        return "other", 0.0
    body = comps.get(instr["calls"], []) if instr["opcode"] == "fusion" else [instr]
    shapes = {i["name"]: i["shape"] for i in body} | {
        n: instrs[n]["shape"] for n in instr["operands"] if n in instrs}
    dots = [i for i in body if i["opcode"] == "dot"]
    if dots:  # a fusion's kind is that of its largest product
        largest = max(dots, key=lambda d: _dot_flop(d, shapes))
        return _dot_kind(largest, shapes), sum(_dot_flop(d, shapes) for d in dots)
    opcodes = {i["opcode"] for i in body}
    if opcodes <= _MOVES:
        return "data movement", 0.0
    if instr["opcode"] in ("while", "call", "conditional", "custom-call", "after-all",
                           "infeed", "outfeed"):
        return "other", 0.0
    return "elementwise", 0.0


def profile(name: str, *, length: int, heads: int, head_dim: int, repeats: int,
            matmul_gflops: float, top: int = 0) -> dict[str, Any]:
    """Seconds per call by kind, the matmuls' counted FLOP, XLA's totals, the untraced wall
    time per call, and the ``top`` slowest operations, for one method."""
    spec = get_attention_spec(name)
    budget = spec.default(spec.budget) if spec.budget else None
    state = methods_lib.make_state(name, jax.random.key(0), budget=budget, length=length,
                                   head_dim=head_dim)
    q, k, v = jax.random.normal(jax.random.key(1), (3, 1, length, heads, head_dim))
    compiled = jax.jit(benchmark_function(name, "fwd_bwd", budget)).lower(
        q, k, v, state).compile()
    instrs, comps = parse_hlo(compiled.as_text())
    for _ in range(2):
        jax.block_until_ready(compiled(q, k, v, state))
    wall = roofline._median_seconds(compiled, q, k, v, state, repeats=repeats)
    events = _traced_events(compiled, (q, k, v, state), repeats)
    seconds = collections.Counter()
    by_op = collections.Counter()
    flop_by_kind = collections.Counter()
    for event in events:
        op = event.get("args", {}).get("hlo_op")
        if event.get("ph") != "X" or op is None:
            continue
        kind, flop = classify(op, instrs, comps)
        if instrs.get(op, {}).get("opcode") in ("while", "call", "conditional"):
            continue  # their bodies' operations are traced one by one
        if flop and flop / (event["dur"] * 1e-6) > matmul_gflops * 1e9:
            kind = "async"  # faster than the square matmul: a launch, not the work
        seconds[kind] += event["dur"] * 1e-6 / repeats
        by_op[op] += event["dur"] * 1e-6 / repeats
        flop_by_kind[kind] += flop / repeats
    # Per-slice counts times the slices, as the roofline counts them (XLA counts a loop's
    # body once).
    gflop, gbyte = slice_cost(name, "fwd_bwd", budget, length=length, head_dim=head_dim,
                              slices=heads)
    slowest = [{"op": op, "kind": classify(op, instrs, comps)[0], "seconds": t,
                "shape": instrs[op]["shape"],
                "body": sorted({i["opcode"] for i in comps.get(instrs[op]["calls"], [])})}
               for op, t in by_op.most_common(top)]
    return {"method": name, "length": length, "wall_s": wall,
            "seconds": {k: seconds[k] for k in KINDS}, "slowest": slowest,
            "gflop_by_kind": {k: flop_by_kind[k] / 1e9 for k in (*MATMULS, "async")},
            "xla_gflop": gflop, "xla_gbyte": gbyte}


def _traced_events(fn: Any, args: tuple[Any, ...], repeats: int) -> list[dict[str, Any]]:
    """The XLA operation events of ``repeats`` calls of ``fn(*args)``, from a profiler
    trace."""
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(repeats):
                jax.block_until_ready(fn(*args))
        path = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                         recursive=True)[0]
        events = json.load(gzip.open(path))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]


def traced_matmul_gflops(rows: int, inner: int, cols: int, repeats: int = 50) -> float:
    """The rate of a (rows, inner) @ (inner, cols) float32 product from its traced
    operation time, measured as the methods' operations are."""
    a = jax.random.normal(jax.random.key(2), (rows, inner))
    b = jax.random.normal(jax.random.key(3), (inner, cols))
    fn = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(fn(a, b))
    seconds = sum(e["dur"] for e in _traced_events(fn, (a, b), repeats)) * 1e-6 / repeats
    return 2 * rows * inner * cols / seconds / 1e9


def long_matmul_layouts(length: int, head_dim: int = 64, repeats: int = 50
                        ) -> dict[str, float]:
    """GFLOP/s (traced operation time) of the same (head_dim × length) @ (length × head_dim)
    product written five ways: is the long contraction's rate a matter of layout or of
    splitting it?"""
    a, b = jax.random.normal(jax.random.key(3), (2, length, head_dim))
    a_t = jnp.asarray(a.T)
    ways = {
        "a.T @ b": (lambda a, b: a.T @ b, (a, b)),
        "pre-transposed a": (lambda a_t, b: a_t @ b, (a_t, b)),
        "einsum nd,ne->de": (lambda a, b: jnp.einsum("nd,ne->de", a, b), (a, b)),
    }
    for parts in (2, 8):
        ways[f"{parts} parts, summed"] = (
            lambda a, b, p=parts: jnp.einsum("cnd,cne->de", a.reshape(p, -1, head_dim),
                                             b.reshape(p, -1, head_dim)), (a, b))
    flop = 2 * length * head_dim * head_dim
    out = {}
    for name, (fn, args) in ways.items():
        fn = jax.jit(fn)
        jax.block_until_ready(fn(*args))
        seconds = sum(e["dur"] for e in _traced_events(fn, args, repeats)) * 1e-6 / repeats
        out[name] = flop / seconds / 1e9
    return out


def _rate(gflop: float, seconds: float, calibration: float) -> str:
    if not seconds:
        return "—"
    gflops = gflop / seconds
    return f"{gflops:.1f} ({gflops / calibration:.0%})"


def markdown(rows: list[dict[str, Any]], rates: roofline.MachineRates,
             calibration: dict[str, float], environment: dict[str, Any]) -> str:
    """The table: time shares by kind, each matmul kind's traced rate against its shape's
    traced calibration, and the no-overlap bound (counted FLOP at the square matmul's rate
    plus counted bytes at the copy's) over the untraced wall time."""
    n = rows[0]["length"]
    lines = [
        f"# Forward+backward time by kind of operation (n = {n}, batch 1, 4 heads, "
        "head_dim 64, float32, one profiled run)", "",
        f"{environment['time']}, JAX {environment['jax']}, {environment['cpu_count']} CPU "
        f"cores, load average {environment['load_average']} at the start. Roofs (wall time "
        f"of the call, as `bench speed --roofline`): {rates.matmul_gflops:.1f} GFLOP/s "
        f"({rates.matmul_size}² matmul), {rates.copy_gbs:.1f} GB/s (copy). Matmul shapes "
        f"(traced operation time): {calibration['matmul']:.1f} GFLOP/s ({n}×64 @ 64×64), "
        f"{calibration['long matmul']:.1f} GFLOP/s (64×{n} @ {n}×64).", "",
        "| method | wall ms | traced ms | matmul | long matmul | elementwise | data movement "
        "| async | matmul GFLOP/s (of its shape's) | long matmul GFLOP/s (of its shape's) "
        "| no-overlap bound ms | of it |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["seconds"]
        total = sum(s.values())
        bound = r["xla_gflop"] / rates.matmul_gflops + r["xla_gbyte"] / rates.copy_gbs
        lines.append(
            f"| {r['method']} | {r['wall_s'] * 1e3:.1f} | {total * 1e3:.1f} | "
            + " | ".join(f"{s[k] / total:.0%}" for k in (*KINDS[:4], "async"))
            + " | " + " | ".join(_rate(r["gflop_by_kind"][k], s[k], calibration[k])
                                 for k in MATMULS)
            + f" | {bound * 1e3:.1f} | {bound / r['wall_s']:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["softmax", "nystrom",
                        "spectral_shift", "skyformer", "performer", "linear"])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="slowest operations recorded")
    parser.add_argument("--layouts", action="store_true",
                        help="also time the long matmul written five ways")
    parser.add_argument("--out", default=None, help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    environment = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "jax": jax.__version__, "cpu_count": os.cpu_count(),
                   "load_average": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
                   "host": platform.node(), "command": " ".join(sys.argv)}
    rates = roofline.calibrate()
    calibration = {"matmul": traced_matmul_gflops(args.length, 64, 64),
                   "long matmul": traced_matmul_gflops(64, args.length, 64)}
    layouts = long_matmul_layouts(args.length) if args.layouts else {}
    for name, gflops in layouts.items():
        print(f"long matmul, {name}: {gflops:.1f} GFLOP/s")
    rows = []
    for name in args.methods:
        rows.append(profile(name, length=args.length, heads=4, head_dim=64,
                            repeats=args.repeats, matmul_gflops=rates.matmul_gflops,
                            top=args.top))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows, rates, calibration, environment)
    print(table)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(table)
        with open(args.out + ".json", "w") as f:
            json.dump({"environment": environment, "rates": rates._asdict(),
                       "matmul_calibration_gflops": calibration,
                       "long_matmul_layouts_gflops": layouts, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    jnp.zeros(())  # initialises the backend before the calibration
    main()
