"""Mamba-2's state-space duality (SSD) as attention: simple GLA with v = Δx, g = ΔA, s = 1."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _common
from spectral_jax.attention.recurrent import _family

Array = jax.Array


def _per_head(method: str, name: str, x: Any, heads: int, trailing_ok: int | None) -> Array:
    shape = getattr(x, "shape", None)
    fits = shape is not None and len(shape) in (1, 2 if trailing_ok else 1) and shape[0] in (
        1, heads) and (len(shape) == 1 or shape[1] in (1, trailing_ok))
    if not fits:
        allowed = f"({heads},)" + (f" or ({heads}, {trailing_ok})" if trailing_ok else "")
        raise UsageError(f"{method}(): `{name}` must have shape {allowed} (one per value "
                         f"head; 1 shares one over the heads); got "
                         f"{shape if shape is not None else type(x)}.")
    return jnp.broadcast_to(jnp.asarray(x), (heads, *shape[1:]))


@_common.drop_in_signature
def mamba2_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, dt: Array, A: Array, D: Array | None = None,
    dt_bias: Array | None = None, dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf), scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 64, segment_ids: Array | None = None,
    initial_state: Array | None = None, return_final_state: bool = False,
    query_seq_lengths: Array | None = None, key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None, **flax_kwargs: Any,
) -> Any:
    """Mamba-2's selective state-space layer core (SSD) in attention form.

    Per value head h, with Δ_t = clamp(softplus?(dt_t + dt_bias)) and A_h ≤ 0:
    h_t = e^{Δ_t A_h} h_{t−1} + Δ_t x_t B_tᵀ, y_t = h_t C_t + D_h x_t. That is simple GLA
    with query C, key B, value Δx, log-decay ΔA and scale 1 (Dao & Gu 2024, §3-4): the
    arguments of Mamba-2's ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D,
    dt_bias=..., dt_softplus=..., dt_limit=...)`` map as ``x → value``, ``B → key``,
    ``C → query``, and the same inputs give the same numbers (before its z-gate). Mamba-2's
    ``ngroups`` G are key/query heads, each shared by H/G value heads (grouped values).
    The state is value-first in Mamba-2, ``(H, P, N)``; here key-first ``(H, N, P)``.

    Args:
      query: C, float ``(batch..., n, G, N)``.
      key: B, float ``(batch..., n, G, N)``.
      value: x, float ``(batch..., n, H, P)``, H a multiple of G.
      bias: must be None.
      mask: optional padding mask, as :func:`spectral_jax.attention.recurrent.gla_attention`.
      dt: float ``(batch..., n, H)``, the step size before ``dt_bias`` and softplus.
      A: float ``(H,)`` ≤ 0 (the module keeps −exp(A_log)).
      D: optional float ``(H,)`` or ``(H, P)``: the skip D·x.
      dt_bias: optional float ``(H,)`` added to ``dt``.
      dt_softplus: apply softplus to dt + dt_bias (Mamba-2's module does).
      dt_limit: Δ is clamped to this range when it is not the default (0, inf), as Mamba-2
        does; a Δ < 0 is an error (concrete values), never clamped silently.
      scale: s; None means 1 (SSD has no logit scale).
      is_causal, chunk_size, segment_ids: as ``gla_attention``.
      initial_state, return_final_state: as ``gla_attention``.
      query_seq_lengths, key_value_seq_lengths, head_chunk_size: as ``gla_attention``.
      **flax_kwargs: as ``gla_attention``.

    Returns:
      y ``(batch..., n, H, P)`` in query's dtype (and the final state ``(batch..., H, N, P)``
      with ``return_final_state``).

    Raises:
      spectral_jax.UsageError: bad shapes, A > 0 or Δ < 0 (concrete values), ``bias``.

    References:
      Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms
      Through Structured State Space Duality", ICML, eq. 2 and §6 (the SSD algorithm).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import mamba2_attention
      >>> c, b = jax.random.normal(jax.random.key(0), (2, 2, 100, 1, 16))
      >>> x = jax.random.normal(jax.random.key(1), (2, 100, 4, 8))
      >>> mamba2_attention(c, b, x, dt=jnp.full((2, 100, 4), 0.1), A=-jnp.ones(4)).shape
      (2, 100, 4, 8)
    """
    method = "mamba2_attention"
    arguments = dict(locals())
    heads = _family.check_call(method, query, key, value, bias, mask, is_causal, flax_kwargs)
    batch_shape, n = query.shape[:-3], query.shape[-3]
    dt = _family.per_state(method, "dt", dt, batch_shape, n, heads.state)
    a = _per_head(method, "A", A, heads.state, None)
    _family.check_range(method, "A", a, -math.inf, 0.0, "A = -exp(A_log)")
    ct = _common.compute_dtype(query.dtype)
    dt = dt.astype(ct)
    if dt_bias is not None:
        dt = dt + _per_head(method, "dt_bias", dt_bias, heads.state, None).astype(ct)
    if _checks.boolean(f"{method}()", "dt_softplus", dt_softplus):
        dt = jnp.where(dt > 20.0, dt, jax.nn.softplus(dt))
    _family.check_range(method, "dt", dt, 0.0, math.inf, "a step size, after dt_bias and "
                        "softplus")
    if tuple(dt_limit) != (0.0, math.inf):  # Mamba-2 clamps only when a limit is set
        dt = jnp.clip(dt, *dt_limit)
    g = (dt * a.astype(ct).reshape((1,) * (dt.ndim - 1) + (-1,)))[..., None]
    x = value.astype(ct)
    skip = None
    if D is not None:
        d = _per_head(method, "D", D, heads.state, value.shape[-1]).astype(ct)
        skip = (d[:, None] if d.ndim == 1 else d) * x
    return _family.run(method, query, key, x * dt[..., None], mask, g=g, beta=None,
                       qk_l2norm=False, flax_kwargs=flax_kwargs, skip=skip, default_scale=1.0,
                       **_family.passed(arguments))
