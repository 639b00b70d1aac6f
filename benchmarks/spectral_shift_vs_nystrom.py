"""Spectral shifting's forward+backward wall time over Nyströmformer's, timed in interleaved pairs.

On a shared, noisy machine one timing of each method can move the ratio by 10% either way;
timing them alternately, call by call, exposes both to the same load. Each block times
``--pairs`` pairs and reports three ratios: of the medians, of the minima, and the median of
the per-pair ratios. Layout as ``spectral-jax bench speed``: batch 1, 4 heads, head_dim 64,
float32, each method's defaults (64 landmarks; spectral shifting's paired δ from 32 rows).

Usage:
    python benchmarks/spectral_shift_vs_nystrom.py --length 8192 --pairs 61 --blocks 5 \
        --out benchmarks/spectral_shift_vs_nystrom.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from spectral_jax.attention import get_attention

METHODS = ("nystrom", "spectral_shift")


def pullback(name: str, q: jax.Array, k: jax.Array, v: jax.Array):
    """The jitted gradient of ``sum(attention(q, k, v) ** 2)``, compiled and warmed up."""
    fn = get_attention(name)
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2)))
    jax.block_until_ready(grad(q, k, v))
    return grad


def time_block(fns: dict, args: tuple, pairs: int) -> dict[str, list[float]]:
    """Seconds per call of each function, called alternately ``pairs`` times."""
    times = {name: [] for name in fns}
    for _ in range(pairs):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=61)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, args.length, 4, 64))
    fns = {name: pullback(name, q, k, v) for name in METHODS}
    blocks = []
    for _ in range(args.blocks):
        t = time_block(fns, (q, k, v), args.pairs)
        nys, shift = t["nystrom"], t["spectral_shift"]
        row = {
            "nystrom_median_ms": 1e3 * statistics.median(nys),
            "spectral_shift_median_ms": 1e3 * statistics.median(shift),
            "ratio_of_medians": statistics.median(shift) / statistics.median(nys),
            "ratio_of_minima": min(shift) / min(nys),
            "median_of_pair_ratios": statistics.median(b / a for a, b in zip(nys, shift)),
        }
        blocks.append(row)
        print(" | ".join(f"{key} {value:.3f}" for key, value in row.items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(
            {"length": args.length, "pairs": args.pairs, "blocks": blocks,
             "load_average": list(os.getloadavg())}, indent=1) + "\n")


if __name__ == "__main__":
    main()
