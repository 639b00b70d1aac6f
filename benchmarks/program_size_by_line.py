"""Which source lines make a method's program large: StableHLO ops counted by the line of
spectral_jax that emitted them, for one attention call's forward and backward.

Compile time follows program size (``benchmarks/compile_time_cpu.md``); this says where the
size comes from. The shape is the quick ListOps preset's layer (32 examples of 128 tokens, 2
heads of 32). Each op is charged to its innermost three spectral_jax frames; ops with no
spectral_jax frame (autodiff's transposes, JAX's own helpers) are counted under ``?``.

    python benchmarks/program_size_by_line.py softmax nystrom spectral_shift skyformer \\
        probsparse improved_clustered --top 10
"""

from __future__ import annotations

import argparse
import collections
import re

import jax
import jax.numpy as jnp

from spectral_jax.attention import get_attention_spec
from spectral_jax.lra.bench import methods as methods_lib
from spectral_jax.lra.bench.speed import benchmark_function

_LOC = re.compile(r"^(#loc\d+) = loc\((.*)\)$", re.M)
_OP = re.compile(r'= "?(stablehlo\.\w+|chlo\.\w+)')
_HLO_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%", re.M)


def ops_by_line(text: str, frames: int = 3) -> collections.Counter[str]:
    """StableHLO ops of a module printed with ``debug_info=True``, by their innermost
    ``frames`` spectral_jax source lines (``file:line <- caller:line``)."""
    locations = {m.group(1): m.group(2) for m in _LOC.finditer(text)}

    def source(ref: str, depth: int = 0) -> list[tuple[str, str]]:
        body = locations.get(ref, ref)
        found = re.findall(r'"([^"]*spectral_jax/[^"]*)":(\d+)', body)
        if found or depth > 20:
            return found
        return [f for inner in re.findall(r"#loc\d+", body) for f in source(inner, depth + 1)]

    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if not _OP.search(line):
            continue
        ref = re.search(r"loc\((#loc\d+)\)\s*$", line)
        where = source(ref.group(1)) if ref else []
        counts[" <- ".join(f"{path.split('spectral_jax/')[-1]}:{number}"
                           for path, number in where[:frames]) or "?"] += 1
    return counts


def program_size(name: str, *, batch: int = 32, length: int = 128, heads: int = 2,
                 head_dim: int = 32) -> tuple[collections.Counter[str], int]:
    """(StableHLO ops by source line, optimised HLO instructions) of ``name``'s forward and
    gradient w.r.t. q, k, v at one layer's shape: the program ``bench speed`` times, with
    the method's default budget and its random state (features, gates, projections)."""
    spec = get_attention_spec(name)
    budget = spec.default(spec.budget) if spec.budget else None
    state = methods_lib.make_state(name, jax.random.key(0), budget=budget, length=length,
                                   head_dim=head_dim)
    x = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.float32)
    lowered = jax.jit(benchmark_function(name, "fwd_bwd", budget)).lower(x, x, x, state)
    counts = ops_by_line(lowered.as_text(debug_info=True))
    return counts, len(_HLO_INSTRUCTION.findall(lowered.compile().as_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", nargs="+")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    for name in args.methods:
        counts, instructions = program_size(name)
        print(f"== {name}: {sum(counts.values())} StableHLO ops, {instructions} optimised HLO "
              "instructions")
        for where, count in counts.most_common(args.top):
            print(f"{count:6d}  {where}")


if __name__ == "__main__":
    main()
