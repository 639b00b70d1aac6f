"""Masks reduced to padding: which queries and keys of each example and head are valid.

The approximate methods cannot honour an arbitrary mask, only padding; this file turns a
mask or sequence lengths into per-(example, head) valid flags and checks that the mask was a
padding mask (at once when concrete, on the device when traced).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError, UsageTypeError, _checks

Array = jax.Array


def padding_from_mask(
    method: str, mask: Array | None, query: Array, key: Array, *,
    query_seq_lengths: Array | None = None, key_value_seq_lengths: Array | None = None,
    with_check: bool = False, causal_offset: int | None = None,
) -> tuple[Array, ...]:
    """Reduces an attention mask to query and key padding, per batch element and head.

    A padding mask is the outer product ``q_valid[:, None] & k_valid[None, :]`` (what
    ``flax.nnx.make_attention_mask`` builds). It is reduced to
    ``key_valid[k] = any_q mask[q, k]`` and ``query_valid[q] = any_k mask[q, k]``, which
    recovers both exactly. Any other mask (causal, banded, ...) is not a padding mask and
    cannot be honoured by these methods: a concrete mask raises a ValueError at once. A mask
    traced under jit is checked on the device, per example (a reduction XLA fuses with the
    mask's construction): ``with_check=True`` also returns that verdict, with which
    :func:`lift` turns the outputs of an example whose mask is not a padding mask into NaN,
    so a wrong mask is never silent; under ``jax.experimental.checkify.checkify`` the same
    check raises an error naming the method and the fault.

    ``query_seq_lengths`` / ``key_value_seq_lengths`` (int ``(batch...,)``, as in
    ``jax.nn.dot_product_attention``) mark only a prefix of each example valid; they are
    combined with the mask by ``and``.

    ``causal_offset`` (the method runs causally; query i sees keys j <= i + offset): only
    that triangle of the mask is read, so a causal mask combined with padding (Flax's
    ``make_causal_mask`` and ``make_attention_mask``) reduces to its padding, concrete or
    traced; a key is valid when a query that may see it does.

    Returns:
      ``query_valid`` bool ``(B, H, q_len)`` and ``key_valid`` bool ``(B, H, kv_len)``, with
      the batch dims flattened to ``B``; with ``with_check``, also ``mask_ok``: bool ``(B,)``
      for a traced mask, else None.
    """
    batch_shape = query.shape[:-3]
    q_len, heads = query.shape[-3], query.shape[-2]
    kv_len = key.shape[-3]
    full = (*batch_shape, heads, q_len, kv_len)
    b = math.prod(batch_shape)
    q_prefix = seq_lengths_valid(method, "query_seq_lengths", query_seq_lengths, batch_shape,
                                 q_len)
    k_prefix = seq_lengths_valid(method, "key_value_seq_lengths", key_value_seq_lengths,
                                 batch_shape, kv_len)
    q_prefix = jnp.ones((b, 1, q_len), bool) if q_prefix is None else q_prefix.reshape(
        b, 1, q_len)
    k_prefix = jnp.ones((b, 1, kv_len), bool) if k_prefix is None else k_prefix.reshape(
        b, 1, kv_len)
    if mask is None:
        return (jnp.broadcast_to(q_prefix, (b, heads, q_len)),
                jnp.broadcast_to(k_prefix, (b, heads, kv_len))) + ((None,) if with_check else ())
    mask = as_bool_mask(method, mask)
    if mask.ndim < 2:  # a 1-D mask broadcasts as a key mask
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
    check_mask_shape(method, mask, full)
    seen = None
    if causal_offset is not None:
        seen = jnp.tril(jnp.ones((q_len, kv_len), bool), k=causal_offset)
        seen = seen.reshape((1,) * (mask.ndim - 2) + seen.shape)
        mask = jnp.logical_and(mask, seen)
    # Reduce before broadcasting: a (B, 1, L, L) outer-product mask is never expanded to
    # (B, H, L, L), and XLA fuses the outer product into these reductions.
    # Row counts rather than a comparison with the outer product: the mask lies inside
    # q_any ⊗ k_any, so it equals it exactly when every non-empty row has as many keys as
    # k_any. The check then reuses the two reductions the padding needs (no third pass).
    row_count = mask.sum(axis=-1, dtype=jnp.int32, keepdims=True)
    q_any = row_count > 0
    k_any = mask.any(axis=-2, keepdims=True)
    # Under causality a row can hold only the valid keys inside its triangle.
    row_keys = k_any if seen is None else k_any & seen
    full_rows = ~q_any | (row_count == row_keys.sum(axis=-1, dtype=jnp.int32, keepdims=True))
    full_rows = full_rows.reshape((1,) * (len(full) - full_rows.ndim) + full_rows.shape)
    mask_ok = jnp.all(full_rows, axis=(-3, -2, -1))  # per example (batch dims of the mask)
    if not isinstance(mask_ok, jax.core.Tracer):
        _raise_if_not_padding(method, jnp.all(mask_ok))
        mask_ok = None
    else:
        # Under jit the mask can only be checked on the device. A host callback raising the
        # error would cost a host sync per call, so the verdict stays on the device: NaN
        # outputs (see lift) and a checkify check.
        mask_ok = jnp.broadcast_to(mask_ok, batch_shape).reshape(b)
        _checks.device_check(jnp.all(mask_ok), _NOT_PADDING.format(method=method))
    query_valid = jnp.broadcast_to(q_any[..., 0], full[:-1]).reshape(b, heads, q_len)
    key_valid = jnp.broadcast_to(k_any[..., 0, :], full[:-2] + full[-1:]).reshape(
        b, heads, kv_len)
    out = (query_valid & q_prefix, key_valid & k_prefix)
    return out + (mask_ok,) if with_check else out


def landmark_query_valid(
    query_valid: Array, key_valid: Array, mask: Array | None,
    query_seq_lengths: Array | None,
) -> Array:
    """Which queries may enter query landmarks (segment means or sampled positions).

    A key padding mask (query axis of size 1, e.g. ``(B, 1, 1, n)``) with no
    ``query_seq_lengths`` says nothing about which queries are padding, so every query counts
    as valid and padded queries' content would reach valid outputs through the landmarks.
    In self-attention shapes (q_len == kv_len) the landmarks then skip the positions of
    padded keys, as Nyströmformer's single token mask does. Only the landmarks change: every
    query the mask allows still gets its output, so equal-length cross-attention is never
    zeroed. Shapes: bool ``(B, H, q_len)`` and ``(B, H, kv_len)``; returns bool
    ``(B, H, q_len)``.
    """
    says_nothing = query_seq_lengths is None and (mask is None or jnp.ndim(mask) < 2
                                                  or jnp.shape(mask)[-2] == 1)
    if says_nothing and query_valid.shape == key_valid.shape:
        return query_valid & key_valid
    return query_valid


def seq_lengths_valid(
    method: str, name: str, lengths: Any, batch_shape: tuple[int, ...], length: int
) -> Array | None:
    """``arange(length) < lengths`` as bool ``(batch..., length)``, or None for no lengths.

    Raises:
      spectral_jax.UsageTypeError: non-integer lengths.
      spectral_jax.UsageError: a shape other than the batch shape, or (when concrete) a value
        outside ``[0, length]``.
    """
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise UsageTypeError(
            f"{method}(): `{name}` must be an integer array; got dtype {lengths.dtype}.")
    if lengths.shape != batch_shape:
        raise UsageError(
            f"{method}(): `{name}` must have the batch shape {batch_shape} (one length per "
            f"example); got shape {lengths.shape}."
        )
    if not isinstance(lengths, jax.core.Tracer) and lengths.size:
        # NumPy, not lengths.min(): under jit a concrete array captured from outside still
        # gives a tracer from jnp operations.
        values = np.asarray(lengths)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > length:
            raise UsageError(
                f"{method}(): `{name}` must lie in [0, {length}] (the sequence length); got "
                f"values from {low} to {high}."
            )
    positions = jnp.arange(length).reshape((1,) * lengths.ndim + (length,))
    return positions < lengths[..., None]


_NOT_PADDING = (
    "{method}(): `mask` must be a padding mask (q_valid[:, None] & k_valid[None, :], as "
    "built by flax.nnx.make_attention_mask); got a mask that is not an outer product, e.g. "
    "causal or banded. Use is_causal=True with a causal method, or softmax_attention for "
    "arbitrary masks.")


def _raise_if_not_padding(method: str, is_padding: Any) -> None:
    if not bool(is_padding):
        raise UsageError(_NOT_PADDING.format(method=method))


def check_mask_shape(
    method: str, mask: Array, full: tuple[int, ...], name: str = "mask"
) -> None:
    if mask.ndim > len(full) or any(m not in (1, f) for m, f in zip(mask.shape[::-1], full[::-1])):
        raise UsageError(
            f"{method}(): `{name}` of shape {mask.shape} does not broadcast to "
            f"(batch..., heads, q_len, kv_len) = {full}."
        )


def as_bool_mask(method: str, mask: Any) -> Array:
    """A boolean mask, True = attend; numeric masks (Flax's default float 1/0) are nonzero."""
    dtype = mask.dtype if hasattr(mask, "dtype") else np.asarray(mask).dtype
    if np.dtype(dtype).kind not in "biuf" and dtype != jnp.bfloat16:
        raise UsageTypeError(
            f"{method}(): `mask` must be boolean or numeric (nonzero = attend); got dtype "
            f"{dtype}."
        )
    mask = jnp.asarray(mask)
    if mask.dtype == jnp.bool_:
        return mask
    if not (jnp.issubdtype(mask.dtype, jnp.integer) or jnp.issubdtype(mask.dtype, jnp.floating)):
        raise UsageTypeError(
            f"{method}(): `mask` must be boolean or numeric (nonzero = attend); got {mask.dtype}."
        )
    return mask != 0
