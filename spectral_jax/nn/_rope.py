"""Rotary position embeddings (RoPE): queries and keys rotated by their positions.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv 2104.09864, §3.2, eq. 34) multiplies each pair of features ``(x_{2i}, x_{2i+1})`` of a
query or key at position ``m`` by the 2-D rotation of angle ``m θ_i``, ``θ_i = base^(-2i/d)``
(``base`` = 10000). A rotation by ``m θ`` then a dot product with a rotation by ``n θ`` is a
rotation by ``(n - m) θ``, so the exact scores ``q_m · k_n`` depend on the positions only
through ``n - m`` (RoFormer eq. 16): the model sees relative positions, and nothing is added
to the token embeddings.

Here the pairs are ``(x_i, x_{i + d/2})`` (the "rotate half" layout of GPT-NeoX and LLaMA)
rather than RoFormer's neighbours ``(x_{2i}, x_{2i+1})``: a fixed permutation of the
features, the same for queries and keys, so the scores are those of eq. 34.

**What an approximation then approximates.** :class:`spectral_jax.nn.MultiHeadAttention`
rotates ``query`` and ``key`` after their projections and before any attention method, so
every method sees the rotated arrays and approximates the exact attention *of the rotated
queries and keys*, whose scores are relative-position scores. What each method builds from
them changes meaning:

- landmark methods (``nystrom``, ``spectral_shift``, ``skyformer``) take segment means of
  the rotated queries and keys as landmarks; a mean of vectors rotated by different angles
  is shorter than its members and carries no single position, so a landmark mixes the
  positions of its segment, and the longer the segment (the fewer landmarks), the more of
  the high-frequency (fast-rotating) features cancel out in it;
- ``performer``'s random features are drawn for the rotated query and key, so its unbiased
  estimate is of ``exp(q_m · k_n)`` with the relative rotation inside, and the relative
  property holds only in expectation over the features;
- ``linformer`` projects the rotated keys along the length, mixing positions in the same way
  as a landmark; clustering and inducing-point methods group or summarise rotated vectors;
- the exact methods (``softmax`` and the causal scans) keep the relative property exactly.

bf16 inputs are rotated in float32 (sines and cosines too) and cast back. For integer
positions the angle ``p θ_i`` is reduced modulo a full turn before it is rounded to float32:
``θ_i / 2π`` is held as a 64-bit fixed-point fraction (two uint32 words from float64), whose
product with ``p`` modulo 1 is exact in wrapping uint32 arithmetic up to one float32
rounding of its low word. The angle then errs by about 4e-7 rad at any int32 position,
where a float32 product ``p * θ_i`` errs by about ``p · 6e-8`` rad (0.06 rad at p = 10⁶).
Float positions take that float32 product.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError, UsageTypeError, _checks

Array = jax.Array

ROPE_BASE = 10000.0  # RoFormer §3.2: θ_i = 10000^(-2i/d)


def rotary_embedding(positions: Array, head_dim: int, *,
                     base: float = ROPE_BASE) -> tuple[Array, Array]:
    """The cosines and sines of RoPE's angles ``p θ_i``, ``θ_i = base^(-2i/head_dim)``.

    Args:
        positions: int or float ``(..., length)`` positions (e.g. ``arange(length)``, or a
          decode step's cache index); integer ones get an angle exact to about 4e-7 rad at
          any int32 value, float ones a float32 product.
        head_dim: features per head; even.
        base: the angle base (RoFormer: 10000).

    Returns:
        ``(cos, sin)``, each float32 ``(..., length, head_dim // 2)``.

    Raises:
        spectral_jax.UsageError: an odd or non-positive ``head_dim``; a non-positive ``base``.

    Source:
        Su et al. 2021, RoFormer, §3.2, eq. 34 and the θ_i below it.

    Example:
        >>> import jax.numpy as jnp
        >>> cos, sin = rotary_embedding(jnp.arange(3), 4)
        >>> cos.shape, [round(float(v), 4) for v in sin[1]]
        ((3, 2), [0.8415, 0.01])
    """
    owner = "rotary_embedding()"
    _checks.positive_int(owner, "head_dim", head_dim)
    if head_dim % 2:
        raise UsageError(_checks.message(owner, "head_dim", "even (RoPE rotates feature "
                                         "pairs)", head_dim))
    _checks.number(owner, "base", base, low=0.0, low_open=True)
    theta = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        angles = positions.astype(jnp.float32)[..., None] * theta.astype(np.float32)
        return jnp.cos(angles), jnp.sin(angles)
    # p θ / 2π modulo 1, from θ / 2π = (hi + lo / 2^32) / 2^32 (module docstring).
    scaled = theta / (2 * np.pi) * 2.0**32
    hi = np.floor(scaled)
    lo = (scaled - hi).astype(np.float32)  # lo / 2^32, in [0, 1)
    p = jnp.abs(positions.astype(jnp.int32)).astype(jnp.uint32)[..., None]
    low = p.astype(jnp.float32) * lo  # p · lo / 2^32 < p: whole units and a fraction
    whole = jnp.floor(low)
    units = p * hi.astype(np.uint32) + whole.astype(jnp.uint32)  # wraps: whole turns drop
    angles = (2 * np.pi / 2.0**32) * (units.astype(jnp.float32) + (low - whole))
    sign = jnp.where(positions < 0, -1.0, 1.0)[..., None].astype(jnp.float32)
    return jnp.cos(angles), sign * jnp.sin(angles)


def _batch_fits(batch: tuple[int, ...], x_batch: tuple[int, ...]) -> bool:
    """Whether positions with leading axes ``batch`` broadcast to ``x``'s batch unchanged."""
    try:
        return jnp.broadcast_shapes(batch, x_batch) == tuple(x_batch)
    except ValueError:
        return False


def check_rope(owner: str, rope: Any, qkv_features: int, num_heads: int) -> bool:
    """``rope`` checked for a layer of ``num_heads`` heads over ``qkv_features`` features.

    Raises:
        spectral_jax.UsageTypeError: ``rope`` is not a bool.
        spectral_jax.UsageError: ``rope`` with an odd head dimension (RoPE rotates pairs).
    """
    _checks.boolean(owner, "rope", rope)
    if rope:
        check_head_dim(owner, "`rope=True`", qkv_features, num_heads,
                       ("qkv_features", "num_heads"))
    return rope


def check_head_dim(owner: str, setting: str, qkv: int, heads: int,
                   names: tuple[str, str]) -> None:
    """Refuses an odd head dimension ``qkv // heads`` where ``setting`` asks for RoPE.

    ``names`` are the two sizes' parameter names, as the caller's user knows them.
    """
    if qkv % heads == 0 and (qkv // heads) % 2:
        raise UsageError(
            f"{owner}: {setting} rotates pairs of features, so the head dimension "
            f"`{names[0]}` / `{names[1]}` = {qkv} / {heads} = {qkv // heads} must be even.")


def check_positions(owner: str, rope: bool, positions: Any) -> None:
    """Refuses ``positions`` for a layer that does not use them (no ``rope``)."""
    if positions is not None and not rope:
        raise UsageError(f"{owner}: `positions` are the rotary positions of `rope=True`; this "
                         "layer has rope=False, so they would be ignored.")


def apply_rope(x: Array, positions: Array | None = None, *, base: float = ROPE_BASE) -> Array:
    """Rotates the features of ``x`` by its positions (RoPE).

    ``out[..., i] = x_i cos(p θ_i) - x_{i+d/2} sin(p θ_i)`` and
    ``out[..., i+d/2] = x_{i+d/2} cos(p θ_i) + x_i sin(p θ_i)`` for ``i < d/2``.

    Args:
        x: float ``(batch, length, heads, head_dim)`` queries or keys (any leading batch
          axes), ``head_dim`` even; bf16 allowed.
        positions: int ``(length,)`` or ``(batch, length)`` positions; None:
          ``arange(length)``.
        base: the angle base (RoFormer: 10000).

    Returns:
        ``x``'s shape and dtype; computed in float32.

    Raises:
        spectral_jax.UsageError: ``x`` with fewer than 3 axes; an odd ``head_dim``;
          ``positions`` whose last axis is not ``length`` or whose batch is not ``x``'s.
        spectral_jax.UsageTypeError: a non-float ``x``.

    Source:
        Su et al. 2021, RoFormer, §3.2, eq. 34 (in the "rotate half" pairing, see the module
        docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> q = jnp.ones((1, 4, 2, 8))
        >>> k = jnp.ones((1, 4, 2, 8))
        >>> s = jnp.einsum("bqhd,bkhd->bhqk", apply_rope(q), apply_rope(k))
        >>> bool(jnp.allclose(s[0, 0, 1, 2], s[0, 0, 2, 3]))  # depends on k - q only
        True
    """
    owner = "apply_rope()"
    if jnp.ndim(x) < 3:
        raise UsageError(f"{owner}: `x` must be (batch..., length, heads, head_dim); got shape "
                         f"{jnp.shape(x)}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise UsageTypeError(f"{owner}: `x` must be a float array (queries or keys); got dtype "
                             f"{x.dtype}.")
    length, head_dim = x.shape[-3], x.shape[-1]
    if positions is None:
        positions = jnp.arange(length)
    positions = jnp.asarray(positions)
    if (positions.ndim == 0 or positions.shape[-1] != length
            or not _batch_fits(positions.shape[:-1], x.shape[:-3])):
        raise UsageError(f"{owner}: `positions` must be (length,) or (batch, length) with "
                         f"length={length} and batch {x.shape[:-3]} (that of `x`); got shape "
                         f"{positions.shape}.")
    cos, sin = rotary_embedding(positions, head_dim, base=base)
    # (..., length, d/2) -> (..., length, 1, d/2): one angle per position, shared by heads.
    cos, sin = cos[..., None, :], sin[..., None, :]
    x32 = x.astype(jnp.float32)
    first, second = x32[..., : head_dim // 2], x32[..., head_dim // 2:]
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)
