"""XLA:CPU compile time of each method's pullback under the test suite's compile flags.

The test suite compiles thousands of small programs whose run time is negligible, so much of
its wall time is XLA:CPU compiling. ``tests/conftest.py`` sets
``--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1`` for the
whole suite (classic emitters, and one LLVM module per program instead of several compiled on
a thread pool); this script measures what each flag buys, per method, in one run, counting
compile plus the first call (XLA:CPU finishes some kernels on first execution): each (method,
setting) pair compiles in a fresh subprocess (no compilation cache,
``jax_disable_most_optimizations`` as in the tests), the settings interleaved method by
method so that load drifts hit them alike.

The program is the one the property tests compile most: ``jax.vjp`` of the method at
``(2, 64, 2, 8)`` with a key padding mask, at its config defaults
(``registry_snapshot.bound_method``).

Usage::

    python benchmarks/cpu_compile_emitters.py [--repeats 2] [--out benchmarks/cpu_compile_emitters]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SETTINGS = {"fusion emitters (default)": "",
            "classic emitters": "--xla_cpu_use_fusion_emitters=false",
            "classic, one codegen module": "--xla_cpu_use_fusion_emitters=false "
                                           "--xla_cpu_parallel_codegen_split_count=1"}
DEFAULT = "fusion emitters (default)"

CHILD = r"""
import json, sys, time
import jax, jax.numpy as jnp
jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_enable_compilation_cache", False)
sys.path.insert(0, sys.argv[2])
from registry_snapshot import bound_method, inputs
q, k, v, cot, _, mask = inputs()
fn, state = bound_method(sys.argv[1])
def pullback(q, k, v, cot):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, state, mask=mask), q, k, v)
    return out, vjp(cot)
lowered = jax.jit(pullback).lower(q, k, v, cot)
start = time.perf_counter()
out, grads = jax.block_until_ready(lowered.compile()(q, k, v, cot))
seconds = time.perf_counter() - start
assert all(bool(jnp.isfinite(x).all()) for x in (out, *grads)), "non-finite output"
print(json.dumps({"compile_s": seconds}))
"""


def _measure(name: str, flags: str) -> dict:
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", CHILD, name, here], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", nargs="*", default=None)
    parser.add_argument("--out", default="benchmarks/cpu_compile_emitters")
    args = parser.parse_args(argv)
    from spectral_jax.attention import available_attentions

    names = args.methods or list(available_attentions())
    labels = list(SETTINGS)
    records = []
    for name in names:
        row = {"method": name}
        for label, flags in SETTINGS.items():
            runs = [_measure(name, flags) for _ in range(args.repeats)]
            row[label] = min(r["compile_s"] for r in runs)
        records.append(row)
        print(f"{name:20s} " + "  ".join(f"{row[label]:6.2f} s" for label in labels), flush=True)
    total = {label: sum(r[label] for r in records) for label in labels}
    lines = ["| method | " + " | ".join(f"{label}: compile + first call (s)" for label in labels)
             + " |", "|---|" + "---:|" * len(labels)]
    lines += [f"| {r['method']} | " + " | ".join(f"{r[label]:.2f}" for label in labels) + " |"
              for r in records]
    lines.append("| **all** | " + " | ".join(f"{total[label]:.2f}" for label in labels) + " |")
    ratios = ", ".join(
        f"{label} {statistics.median(r[DEFAULT] / r[label] for r in records):.2f}"
        for label in labels if label != DEFAULT)
    lines.append(f"\nMedian speed-up over the default: {ratios}; minimum of {args.repeats} "
                 f"compiles per cell, load average "
                 f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.")
    text = "\n".join(lines)
    print(text)
    with open(f"{args.out}.json", "w") as f:
        json.dump({"settings": SETTINGS, "repeats": args.repeats, "records": records}, f, indent=1)
    with open(f"{args.out}.md", "w") as f:
        f.write(f"# {__doc__.splitlines()[0]}\n\nCommand: "
                f"`python benchmarks/cpu_compile_emitters.py --repeats {args.repeats}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
