"""Linformer: softmax attention over keys and values projected along the sequence axis."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._prologue import prologue

Array = jax.Array


def _linformer_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
    e: Array, f: Array, *, scale: float,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    n = k.shape[0]
    # Padded rows are zeroed before projecting: otherwise padding leaks into every
    # compressed key and value. Inputs shorter than max_length use the first n columns.
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    v = jnp.where(k_valid[:, None], v.astype(ct), 0.0)
    # On a split sequence each shard holds its own columns of E and F: the projections are
    # sums over the sequence, one all-reduce of (proj_len, d + d_v).
    pk, pv = _seq.total((e[:, :n].astype(ct) @ k, f[:, :n].astype(ct) @ v))  # (proj_len, d)
    weights = jax.nn.softmax((q.astype(ct) * scale) @ pk.T, axis=-1)
    out = weights @ pv
    return jnp.where(q_valid[:, None] & (_seq.total(k_valid.sum()) > 0), out, 0.0)


@_common.drop_in_signature
def linformer_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    key_projection: Array | None = None,
    value_projection: Array | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Linformer attention: softmax(Q (E K)ᵀ · scale) (F V), with E, F of shape (k, max_length).

    Keys and values are compressed along the sequence axis to ``proj_len`` rows by learned
    projections (owned by :class:`spectral_jax.nn.MultiHeadAttention`). Padded keys and
    values are zeroed before projecting, and a sequence of length n < max_length uses the
    first n columns. Padded queries and queries with no valid key give zero rows.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``.
      key: float ``(batch..., kv_len, kv_heads, head_dim)``, ``kv_heads`` dividing
        ``heads`` (grouped-query attention: E·K and F·V made once per key/value head).
      value: float ``(batch..., kv_len, kv_heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False.
      key_projection: E, float ``(proj_len, max_length)`` shared by heads, or
        ``(kv_heads, proj_len, max_length)`` per key/value head. Required.
      value_projection: F, same shape as E; None shares E (Linformer's key-value sharing).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias``, missing or mis-shaped projections, or
        kv_len longer than the projections' max_length.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", arXiv:2006.04768,
      eq. (7) and §4 (parameter sharing); fairseq ``MultiheadLinearAttention``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import linformer_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> e = jax.random.normal(jax.random.key(1), (32, 128)) / 128**0.5
      >>> linformer_attention(q, k, v, key_projection=e).shape
      (2, 128, 4, 16)
    """
    method = "linformer_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    heads, kv_len = key.shape[-2], key.shape[-3]  # projections act on the key/value heads
    if value_projection is None:
        value_projection = key_projection
    for name, p in (("key_projection", key_projection), ("value_projection", value_projection)):
        if p is None or getattr(p, "ndim", 0) not in (2, 3) or (
                p.ndim == 3 and p.shape[0] != heads):
            raise UsageError(
                f"{method}(): `{name}` must be (proj_len, max_length) or (heads={heads}, "
                f"proj_len, max_length); got {getattr(p, 'shape', p)!r}."
            )
        if p.shape[-1] < kv_len:
            raise UsageError(
                f"{method}(): the sequence has kv_len={kv_len} tokens but `{name}` covers "
                f"max_length={p.shape[-1]}; use inputs of at most max_length tokens."
            )
    if key_projection.shape[-2:] != value_projection.shape[-2:]:
        raise UsageError(
            f"{method}(): key_projection {key_projection.shape} and value_projection "
            f"{value_projection.shape} differ in (proj_len, max_length)."
        )
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    b = p.query_valid.shape[0]
    per_head = lambda e: jnp.broadcast_to(e, (b, heads, *e.shape[-2:]))  # noqa: E731
    head = functools.partial(_linformer_head, scale=p.scale)
    # With grouped heads E·K and F·V are made once per key/value head for its query group.
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid,
        key_args=(per_head(key_projection), per_head(value_projection)), method=method,
        head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)
