"""Symmetric attention softmax(s·XXᵀ)V: Nyström vs spectral shifting vs the SPSD-kernel forms.

For each ``bench error`` regime the regime's query X is used as both query and key (symmetric
attention, Courtois et al. 2024), and each method's output is compared with exact softmax
attention: relative error ‖Y − Y*‖_F / ‖Y*‖_F (``output``) and, with V = I, the relative
Frobenius error of the implicit attention matrix (``frobenius``), median over seeds. One more
regime, ``growing_walk``, is the shared attention tests' query: a random walk of N(0, 0.3²)
steps, whose norms grow along the sequence.

Usage:
    python benchmarks/symmetric_shift_error.py --length 1024 --num-landmarks 64 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import (
    nystrom_attention,
    softmax_attention,
    spectral_shift_attention,
    symmetric_spectral_shift_attention,
)
from spectral_jax.lra.bench.inputs import REGIMES, make_inputs

METHODS = {
    "nystrom": lambda x, v, m: nystrom_attention(x, x, v, num_landmarks=m),
    "spectral_shift": lambda x, v, m: spectral_shift_attention(x, x, v, num_landmarks=m),
    "sym_none": lambda x, v, m: symmetric_spectral_shift_attention(
        x, x, v, num_landmarks=m, shift="none"),
    "sym_trace": lambda x, v, m: symmetric_spectral_shift_attention(
        x, x, v, num_landmarks=m, shift="trace"),
    "sym_diagonal": lambda x, v, m: symmetric_spectral_shift_attention(
        x, x, v, num_landmarks=m, shift="diagonal"),
}


def rel(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--num-landmarks", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--x64", action="store_true", help="compute in float64")
    parser.add_argument("--stat", choices=("median", "p90", "max"), default="median",
                        help="statistic over seeds (the tail shows rows that cancel)")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", args.x64)
    dtype = jnp.float64 if args.x64 else jnp.float32
    n, d, m = args.length, args.head_dim, args.num_landmarks
    eye = jnp.eye(n, dtype=dtype)[None, :, None, :]
    fns = {k: jax.jit(functools.partial(f, m=m)) for k, f in METHODS.items()}
    exact_fn = jax.jit(lambda x, v: softmax_attention(x, x, v))
    print(f"n={n} head_dim={d} num_landmarks={m} dtype={jnp.dtype(dtype).name} "
          f"seeds={args.seeds}; {args.stat} relative error, output | frobenius")
    print(f"{'regime':<13}" + "".join(f"{k:>22}" for k in METHODS))
    for regime in (*REGIMES, "growing_walk"):
        errs = {k: [] for k in METHODS}
        for seed in args.seeds:
            if regime == "growing_walk":
                kx, kv = jax.random.split(jax.random.key(seed))
                x = jnp.cumsum(0.3 * jax.random.normal(kx, (1, n, 1, d), dtype), axis=1)
                v = jax.random.normal(kv, (1, n, 1, d), dtype)
            else:
                x, _, v = make_inputs(regime, jax.random.key(seed), length=n, heads=1,
                                      head_dim=d, dtype=dtype)
            exact, exact_m = exact_fn(x, v), exact_fn(x, eye)
            for k, f in fns.items():
                errs[k].append((rel(f(x, v), exact), rel(f(x, eye), exact_m)))
        q = {"median": 0.5, "p90": 0.9, "max": 1.0}[args.stat]
        med = {k: np.quantile(np.array(errs[k]), q, axis=0) for k in METHODS}
        row = "".join(f"{med[k][0]:>12.3g} | {med[k][1]:<7.3g}" for k in METHODS)
        print(f"{regime:<13}{row}")


if __name__ == "__main__":
    main()
