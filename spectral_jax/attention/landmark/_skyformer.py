"""Skyformer: the symmetrised Nyström approximation of Gaussian-kernel attention."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._landmarks import evenly_spaced_positions, random_positions
from spectral_jax.attention.core._prologue import prologue, slice_keys
from spectral_jax.attention.exact._kernelized import gaussian_kernel
from spectral_jax.attention.landmark._nystrom import check_landmark_args
from spectral_jax.attention.landmark._pinv import iterative_pinv

Array = jax.Array


def _skyformer_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, q_landmark_valid: Array,
    rng: Array | None = None, *,
    scale: float, num_landmarks: int, ridge: float, pinv_iterations: int | None,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    root = scale**0.5
    q = jnp.where(q_valid[:, None], q.astype(ct) * root, 0.0)
    k = jnp.where(k_valid[:, None], k.astype(ct) * root, 0.0)
    v = v.astype(ct)
    # Landmarks are rows of [Q; K]: half from the queries, half from the keys, valid only.
    m_q, m_k = (num_landmarks + 1) // 2, num_landmarks // 2
    if rng is None:
        pos_q = evenly_spaced_positions(q_landmark_valid, m_q)
        pos_k = evenly_spaced_positions(k_valid, m_k)
    else:
        rng_q, rng_k = jax.random.split(rng)
        pos_q = random_positions(rng_q, q_landmark_valid, m_q)
        pos_k = random_positions(rng_k, k_valid, m_k)
    # On a sequence split over devices the m landmark rows are gathered from their shards.
    landmarks = jnp.concatenate([_seq.take(q, pos_q), _seq.take(k, pos_k)])
    lm_valid = jnp.concatenate([_seq.take(q_landmark_valid, pos_q), _seq.take(k_valid, pos_k)])
    q_s = gaussian_kernel(q, landmarks) * lm_valid[None, :]  # (n, m)
    k_s = gaussian_kernel(k, landmarks) * (lm_valid[None, :] & k_valid[:, None])
    pair = lm_valid[:, None] & lm_valid[None, :]
    eye = jnp.eye(num_landmarks, dtype=ct)
    # Invalid landmarks get an identity row/column so they decouple from the valid block.
    inner = jnp.where(pair, gaussian_kernel(landmarks, landmarks), 0.0) + ridge * eye
    inner = jnp.where(lm_valid[:, None] | lm_valid[None, :], inner, eye)
    # D^{-1/2}(M + γI)D^{-1/2} has spectrum in (0, 1] (Skyformer Lemma 3), so the iteration
    # converges; the D^{-1/2} factors are undone afterwards.
    d_inv_sqrt = jax.lax.rsqrt(inner.sum(-1))
    z = iterative_pinv(d_inv_sqrt[:, None] * inner * d_inv_sqrt[None, :], pinv_iterations)
    z = d_inv_sqrt[:, None] * z * d_inv_sqrt[None, :]
    out = q_s @ (z @ _seq.total(k_s.T @ v))
    return jnp.where(q_valid[:, None], out, 0.0)


@_common.drop_in_signature
def skyformer_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    num_landmarks: int = 128,
    rng: Array | None = None,
    ridge: float = 0.1,
    pinv_iterations: int | None = 6,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Skyformer: symmetrised Nyström approximation of :func:`kernelized_attention`.

    The Gaussian kernel is PSD on the stacked points X = [Q; K] (scaled by scale^{1/2} =
    head_dim^{-1/4} by default, never a hard-coded 32^{-1/4}). With ``num_landmarks`` rows X_S of
    X (⌈m/2⌉ queries, ⌊m/2⌋ keys, valid positions only),

        out = κ(Q, X_S) · (κ(X_S, X_S) + γI)⁻¹ · κ(X_S, K) · V,

    where the inverse is the :func:`iterative_pinv` of the D^{-1/2}-preconditioned matrix
    (D = diag((κ_SS + γI)1)). With ``rng`` the landmarks are drawn uniformly with replacement
    among valid positions, one independent draw per (batch element, head) keyed by
    ``fold_in`` so an example never depends on its batch; with ``rng=None`` they are evenly
    spaced over the valid positions (deterministic; with m = 2·n_valid this is every query
    and key once, and with ``ridge=0, pinv_iterations=None`` the result is exactly
    :func:`kernelized_attention`). Any padding side works.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``.
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: default ``1/sqrt(head_dim)``.
      is_causal: must be False.
      num_landmarks: m, the sketch size d_s (Skyformer uses 128).
      rng: a ``jax.random`` key for sampling landmarks, or None for evenly spaced landmarks.
      ridge: γ ≥ 0 added to the landmark kernel (Skyformer uses 0.1).
      pinv_iterations: iterations of :func:`iterative_pinv` (None = exact pinv).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias``, ``num_landmarks`` < 1, ``ridge`` < 0, bad
        ``pinv_iterations``, non-padding mask.
      spectral_jax.UsageTypeError: ``rng`` that is not a PRNG key array.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Chen et al. 2021, "Skyformer", NeurIPS, §4.2 eq. (4)-(6) and Lemma 3; code
      pkuzengqi/Skyformer ``attention_skyformer.py``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import skyformer_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> skyformer_attention(q, k, v, num_landmarks=16, rng=jax.random.key(1)).shape
      (2, 128, 4, 16)
    """
    method = "skyformer_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    check_landmark_args(method, num_landmarks, pinv_iterations, "per_matrix")
    ridge = _checks.number(f"{method}()", "ridge", ridge, low=0.0, what="a finite float >= 0")
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(
        _skyformer_head, scale=p.scale, num_landmarks=num_landmarks, ridge=ridge,
        pinv_iterations=pinv_iterations,
    )
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid, p.landmark_valid,
        *slice_keys(method, rng, p.query_valid),
        method=method, head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)
