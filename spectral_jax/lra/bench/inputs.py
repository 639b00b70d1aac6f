"""Synthetic query/key/value regimes for the approximation-error benchmark."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError

Array = jax.Array

REGIMES = ("diffuse", "sharp", "random_walk", "varying_norm")


def random_walk_tokens(rng: Array, shape: tuple[int, ...], correlation_length: float) -> Array:
    """Stationary AR(1) walks along axis -3: x_t = ρ x_{t-1} + √(1-ρ²) ε_t, ρ = e^{-1/ℓ}.

    Every coordinate has unit variance and corr(x_t, x_{t+s}) = ρ^s, so neighbouring tokens
    are similar, as in text or image patches, which is what segment-means landmarks assume.

    Args:
      rng: a ``jax.random`` key.
      shape: ``(batch, n, heads, dim)``.
      correlation_length: ℓ > 0 in tokens.

    Returns:
      float32 array of ``shape``.

    Raises:
      spectral_jax.UsageError: ``correlation_length`` <= 0 or ``shape`` not 4-D.

    Example:
      >>> import jax
      >>> from spectral_jax.lra.bench.inputs import random_walk_tokens
      >>> random_walk_tokens(jax.random.key(0), (1, 32, 2, 4), 8.0).shape
      (1, 32, 2, 4)
    """
    if len(shape) != 4:
        raise UsageError(f"`shape` must be (batch, n, heads, dim); got {shape!r}.")
    if not correlation_length > 0:
        raise UsageError(f"`correlation_length` must be > 0 tokens; got {correlation_length!r}.")
    rho = float(np.exp(-1.0 / correlation_length))
    noise = jax.random.normal(rng, shape, jnp.float32)
    first = noise[:, :1]
    # A Python float is weakly typed: the walk stays float32 with jax_enable_x64 on too.
    steps = float(np.sqrt(1.0 - rho * rho)) * noise[:, 1:]

    def step(x: Array, eps: Array) -> tuple[Array, Array]:
        x = rho * x + eps
        return x, x

    _, rest = jax.lax.scan(step, first[:, 0], jnp.moveaxis(steps, 1, 0))
    return jnp.concatenate([first, jnp.moveaxis(rest, 0, 1)], axis=1)


def make_inputs(
    regime: str,
    rng: Array,
    *,
    batch: int = 1,
    length: int = 1024,
    heads: int = 2,
    head_dim: int = 64,
    sharpness: float = 2.0,
    correlation_length: float = 32.0,
    norm_spread: float = 0.5,
    dtype: Any = jnp.float32,
) -> tuple[Array, Array, Array]:
    """Query, key and value arrays of one synthetic attention regime.

    - ``"diffuse"``: independent q, k, v ~ N(0, 1). Logits q·k/√d have unit variance, so every
      row of the attention matrix is spread over many keys and tr(S) ≈ 1.
    - ``"sharp"``: q = k = ``sharpness``·x with x ~ N(0, 1). The diagonal logit s²‖x‖²/√d ≈
      s²√d dwarfs the off-diagonal ones (standard deviation s²), so S is close to the
      identity and tr(S) ≈ n: the case a rank-m approximation cannot represent.
    - ``"random_walk"``: q, k, v are random linear maps (N(0, 1/d) weights) of shared
      locally correlated tokens (:func:`random_walk_tokens`), like a trained layer's inputs.
    - ``"varying_norm"``: q = k = ρ_i·x_i with x ~ N(0, 1) and a log-normal norm per token,
      ρ_i = exp(``norm_spread``·z_i), z ~ N(0, 1). The diagonal logit ρ_i²‖x_i‖²/√d ranges
      from diffuse to sharp across the tokens of one sequence, so no single shift of the
      diagonal fits all of them.

    Args:
      regime: one of ``REGIMES``.
      rng: a ``jax.random`` key.
      batch, length, heads, head_dim: the layout ``(batch, length, heads, head_dim)``.
      sharpness: s > 0, used by ``"sharp"`` (the norm scale of q = k).
      correlation_length: ℓ > 0 tokens, used by ``"random_walk"``.
      norm_spread: σ ≥ 0, the log-normal spread of token norms in ``"varying_norm"``.
      dtype: float dtype of the results.

    Returns:
      ``(query, key, value)``, each ``(batch, length, heads, head_dim)`` of ``dtype``.

    Raises:
      spectral_jax.UsageError: unknown ``regime``, non-positive sizes or ``sharpness``, negative
        ``norm_spread``.

    Example:
      >>> import jax
      >>> from spectral_jax.lra.bench.inputs import make_inputs
      >>> q, k, v = make_inputs("sharp", jax.random.key(0), length=16, head_dim=4)
      >>> bool((q == k).all())
      True
    """
    if regime not in REGIMES:
        raise UsageError(f"`regime` must be one of {REGIMES}; got {regime!r}.")
    for name, value in (("batch", batch), ("length", length), ("heads", heads),
                        ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"`{name}` must be a positive int; got {value!r}.")
    if not sharpness > 0:
        raise UsageError(f"`sharpness` must be > 0; got {sharpness!r}.")
    if not norm_spread >= 0:
        raise UsageError(f"`norm_spread` must be >= 0; got {norm_spread!r}.")
    shape = (batch, length, heads, head_dim)
    kq, kk, kv = jax.random.split(rng, 3)
    if regime == "diffuse":
        q, k, v = (jax.random.normal(r, shape, jnp.float32) for r in (kq, kk, kv))
    elif regime == "sharp":
        q = k = sharpness * jax.random.normal(kq, shape, jnp.float32)
        v = jax.random.normal(kv, shape, jnp.float32)
    elif regime == "varying_norm":
        x = jax.random.normal(kq, shape, jnp.float32)
        # A Python float keeps the norms float32 with jax_enable_x64 on, too.
        rho = jnp.exp(float(norm_spread) * jax.random.normal(kk, (*shape[:-1], 1), jnp.float32))
        q = k = rho * x
        v = jax.random.normal(kv, shape, jnp.float32)
    else:
        x = random_walk_tokens(kq, shape, correlation_length)
        w = jax.random.normal(kk, (3, heads, head_dim, head_dim), jnp.float32)
        w = w / float(np.sqrt(head_dim))  # a Python float: float32 with x64 on, too
        q, k, v = (jnp.einsum("bnhd,hde->bnhe", x, w[i]) for i in range(3))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)
