"""How much of spectral shifting's gradient flows through δ, and what dropping it would save.

Issue 17 asks whether δ (one scalar per example and head) needs its gradient. Without
padding, spectral shifting is out = (1 − δ)·nystrom(q, k, v) + δ·v, so holding δ at its value
δ₀ gives the same output and the gradient a stop-gradient on δ would give. For each
``bench error`` regime this prints δ and the relative change ‖∇_full − ∇_frozen‖ / ‖∇_full‖ of
the gradients with respect to q, k and v (a random output cotangent, median over seeds).

``--cost-length`` adds XLA's forward+backward operation counts for one (example, head) slice:
Nyströmformer, spectral shifting, and the frozen form. The frozen form here computes δ by a
separate ``spectral_shift_delta`` call, which recomputes the landmark kernels; sharing them
would save about two more n·m·d products.

Usage:
    python benchmarks/spectral_shift_delta_gradient.py --length 512 --num-landmarks 32 \
        --seeds 0 1 2 --x64 --cost-length 4096
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import nystrom_attention, spectral_shift_attention, spectral_shift_delta
from spectral_jax.lra.bench.inputs import REGIMES, make_inputs
from spectral_jax.lra.compiled import compiled_cost


def full(q, k, v, m):
    return spectral_shift_attention(q, k, v, num_landmarks=m)


def frozen(q, k, v, m):
    """Spectral shifting with δ held constant: its output, and the gradient without δ's."""
    delta = jax.lax.stop_gradient(spectral_shift_delta(q, k, num_landmarks=m))
    delta = delta[..., None, :, None]  # (batch, heads) against (batch, n, heads, d)
    return (1.0 - delta) * nystrom_attention(q, k, v, num_landmarks=m) + delta * v


@functools.partial(jax.jit, static_argnames="num_landmarks")
def _both_forms(q, k, v, g, num_landmarks):
    """Each form's output and gradients pulled back along g, and δ: one program per shape."""
    outs, grads = {}, {}
    for name, fn in (("full", full), ("frozen", frozen)):
        # One forward pass gives both the output and, pulled back along g, the gradients.
        outs[name], pullback = jax.vjp(lambda q, k, v, fn=fn: fn(q, k, v, num_landmarks), q, k, v)
        grads[name] = pullback(g)
    return outs, grads, spectral_shift_delta(q, k, num_landmarks=num_landmarks)


def gradient_change(regime: str, seed: int, *, length: int, heads: int, head_dim: int,
                    num_landmarks: int, dtype) -> dict[str, float]:
    """δ's range, the output gap between the two forms, and the relative gradient changes."""
    q, k, v = make_inputs(regime, jax.random.key(seed), length=length, heads=heads,
                          head_dim=head_dim, dtype=dtype)
    g = jax.random.normal(jax.random.key(seed + 1000), v.shape, dtype)
    outs, grads, delta = _both_forms(q, k, v, g, num_landmarks)
    gap = jnp.abs(outs["full"] - outs["frozen"]).max()
    change = {}
    for i, name in enumerate("qkv"):
        a, b = grads["full"][i], grads["frozen"][i]
        norm = float(jnp.linalg.norm(a))
        change[name] = float(jnp.linalg.norm(a - b)) / norm if norm > 0 else 0.0
    return {"delta_min": float(delta.min()), "delta_max": float(delta.max()),
            "output_gap": float(gap), **change}


def slice_flops(fn, length: int, head_dim: int, num_landmarks: int) -> float:
    """XLA's forward+backward floating-point operations (10⁹) for one (example, head)."""
    spec = jax.ShapeDtypeStruct((1, length, 1, head_dim), jnp.float32)
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, num_landmarks))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec).compile()
    return compiled_cost(compiled)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--num-landmarks", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--x64", action="store_true", help="compute in float64")
    parser.add_argument("--cost-length", type=int, nargs="*", default=[],
                        help="lengths for the operation counts (head_dim 64, 64 landmarks)")
    args = parser.parse_args(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.float64 if args.x64 else jnp.float32
    print("regime        δ range      output gap  |Δ∇q|/|∇q|  |Δ∇k|/|∇k|  |Δ∇v|/|∇v|")
    for regime in args.regimes:
        rows = [gradient_change(regime, s, length=args.length, heads=args.heads,
                                head_dim=args.head_dim, num_landmarks=args.num_landmarks,
                                dtype=dtype) for s in args.seeds]
        med = {key: float(np.median([r[key] for r in rows])) for key in ("q", "k", "v")}
        print(f"{regime:<13} {min(r['delta_min'] for r in rows):.3f}-"
              f"{max(r['delta_max'] for r in rows):.3f}  "
              f"{max(r['output_gap'] for r in rows):10.1e}  {med['q']:10.3f}  {med['k']:10.3f}  "
              f"{med['v']:10.3f}")
    nys = lambda q, k, v, m: nystrom_attention(q, k, v, num_landmarks=m)  # noqa: E731
    for n in args.cost_length:
        counts = {name: slice_flops(fn, n, 64, 64)
                  for name, fn in (("nystrom", nys), ("spectral_shift", full), ("frozen", frozen))}
        print(f"n={n}: GFLOP fwd+bwd " + ", ".join(
            f"{name} {c:.3f} ({c / counts['nystrom']:.2f}×)" for name, c in counts.items()))


if __name__ == "__main__":
    main()
