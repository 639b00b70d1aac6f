"""Gaussian-kernel attention: the exact attention that Skyformer approximates."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.core._ring import ring_blocks

Array = jax.Array


def gaussian_kernel(x: Array, y: Array) -> Array:
    """exp(−‖x_i − y_j‖²/2) for rows of ``x (n, d)`` and ``y (m, d)``; float ``(n, m)``."""
    sq = jnp.sum(x * x, -1)[:, None] + jnp.sum(y * y, -1)[None, :] - 2.0 * (x @ y.T)
    return jnp.exp(-0.5 * jnp.maximum(sq, 0.0))


def _kernelized_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, *, scale: float
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    # Scaling both sides by sqrt(scale) = d^{-1/4} keeps q·k·scale, as in Skyformer's code.
    root = scale**0.5
    q, k, v = q.astype(ct) * root, k.astype(ct) * root, v.astype(ct)
    # Padded keys are zeroed before the kernel, not only masked after it: inf - inf is NaN.
    k = jnp.where(k_valid[:, None], k, 0.0)

    def update(acc, kb, vb, valid, _):
        block = (gaussian_kernel(q, kb) * valid[None, :]) @ vb
        return block if acc is None else acc + block

    # One block on one device; on a split sequence, every shard's keys in turn (a ring).
    return jnp.where(q_valid[:, None], ring_blocks(update, None, k, v, k_valid), 0.0)


@_common.drop_in_signature
def kernelized_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Exact Gaussian-kernel attention κ(Q·c, K·c)·V with c = scale^{1/2}, in O(n²).

    κ(x, y) = exp(−‖x − y‖²/2) = exp(x·y)·exp(−‖x‖²/2)·exp(−‖y‖²/2): softmax's kernel with a
    symmetric diagonal normalisation instead of row sums, so rows do not sum to one. This is
    what :func:`skyformer_attention` approximates. Padded keys get weight 0 and padded
    queries give zero rows.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``.
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: default ``1/sqrt(head_dim)`` (so c = head_dim^{-1/4}).
      is_causal: must be False.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias`` given, a non-padding mask.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Chen et al. 2021, "Skyformer: Remodel Self-Attention with Gaussian Kernel and Nyström
      Method", NeurIPS, §4.1; code pkuzengqi/Skyformer ``SoftmaxAttention_RBF``.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import kernelized_attention
      >>> q = k = v = jnp.ones((1, 4, 1, 2))
      >>> float(kernelized_attention(q, k, v)[0, 0, 0, 0])  # 4 keys at distance 0, weight 1
      4.0
    """
    method = "kernelized_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(_kernelized_head, scale=p.scale)
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid,
        method=method, head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)
