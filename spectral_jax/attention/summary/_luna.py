"""Luna: linear unified nested attention, pack into l extra tokens P' then unpack from them."""

from __future__ import annotations

from typing import Any

import jax

from spectral_jax import UnsupportedError, _checks
from spectral_jax.attention.core import _common
from spectral_jax.attention.core._hints import causal_methods_hint
from spectral_jax.attention.core._prologue import Prologue, prologue
from spectral_jax.attention.summary._inducing_points import (
    check_summary_queries,
    check_value_dim,
    read_summary,
    summarise,
)

Array = jax.Array


def _prepare(
    method: str, query: Array, key: Array, value: Array, bias: Array | None, mask: Array | None,
    packed_query: Any, scale: Any, is_causal: bool, query_seq_lengths: Array | None,
    key_value_seq_lengths: Array | None, head_chunk_size: Any, flax_kwargs: dict[str, Any],
) -> tuple[Array, Prologue]:
    # causal_ok: the refusal below says why Luna has no causal form.
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask,
                       causal_ok=True)
    if is_causal:
        raise UnsupportedError(
            f"{method}(): `is_causal=True` is not implemented: the packed sequence P' mixes "
            "every key position (Luna's causal form needs a separate per-position pack). "
            f"{causal_methods_hint()}"
        )
    packed_query = check_summary_queries(method, "packed_query", packed_query, query)
    _checks.positive_int(f"{method}()", "head_chunk_size", head_chunk_size, allow_none=True)
    return packed_query, prologue(method, query, key, mask, scale,
                                  query_seq_lengths=query_seq_lengths,
                                  key_value_seq_lengths=key_value_seq_lengths)


def luna_pack(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    packed_query: Array,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Luna's pack step alone: P' = softmax(s · P Kᵀ) V per head, over valid keys only.

    ``query`` is only used for its layout and, with ``mask``, for the padding; see
    :func:`luna_attention` for the arguments. A module that projects P' before the unpack
    step (Luna's ``c_proj``) calls this, projects, then runs ``softmax_attention``.

    Returns:
      ``(batch..., l, heads, v_head_dim)`` in ``query``'s dtype; rows of an example with no
      valid key are zero.

    Raises:
      As :func:`luna_attention`, except that any value width is allowed.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import luna_pack
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> p = jax.random.normal(jax.random.key(1), (8, 4, 16))
      >>> luna_pack(q, k, v, packed_query=p).shape
      (2, 8, 4, 16)
    """
    method = "luna_pack"
    packed_query, p = _prepare(
        method, query, key, value, bias, mask, packed_query, scale, is_causal,
        query_seq_lengths, key_value_seq_lengths, head_chunk_size, flax_kwargs)
    packed = summarise(method, packed_query, key, value, p.key_valid, scale=p.scale,
                       head_chunk_size=head_chunk_size)
    return _common.poison_invalid(packed, p.mask_ok).astype(query.dtype)


@_common.drop_in_signature
def luna_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    packed_query: Array,
    scale: float | None = None,
    is_causal: bool = False,
    return_packed: bool = False,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array | tuple[Array, Array]:
    """Luna attention: pack the keys into l extra tokens, unpack them to the queries, O(n·l·d).

    Per head, with the extra sequence P (l × d, ``packed_query``) and s = ``scale``:

        P' = softmax(s · P Kᵀ) V          (pack: P reads the valid keys; l × d_v)
        Y  = softmax(s · Q P'ᵀ) P'        (unpack: the queries read P' as keys and values)

    ``return_packed=True`` also returns P', which Luna passes (after its residual and layer
    norm) to the next layer as that layer's P; the first layer's P is a learned parameter
    with a positional embedding. The reference code ties keys and values of each step
    (``tie_kv``): pack uses K = V = X·W_pc, unpack K = V = P'·W_c, with W_pq on P and W_q on
    X. Here the projections are the caller's: pass K = V for the tied pack, and use
    :func:`luna_pack` then ``softmax_attention`` to project P' before the unpack. Pack and
    unpack share the head count (the reference allows a different one for pack) and ``scale``.

    Padded keys never reach P' (the pack softmax is over valid keys only); padded queries
    give zero rows; an example with no valid key has P' = 0 and zero outputs.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``; bf16 in, bf16 out (float32
        inside, also for P' between the steps).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, head_dim)`` (P' is read as keys, so the value
        width must equal the query's).
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      packed_query: P, float ``(l, heads, head_dim)`` (the first layer's learned P, shared
        by the batch) or ``(batch..., l, heads, head_dim)`` (a previous layer's P'); a heads
        axis of 1 is shared by every head. The paper uses l = 16, 128 or 256 (LRA: 256).
      scale: logit scale of both steps, default ``1/sqrt(head_dim)``.
      is_causal: must be False.
      return_packed: also return P'.

    Returns:
      Y ``(batch..., q_len, heads, head_dim)`` in ``query``'s dtype; with ``return_packed``,
      ``(Y, P')`` with P' ``(batch..., l, heads, head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes (including ``packed_query`` and a value width other
        than the query's), ``bias`` given, a mask that is not a padding mask.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).
      spectral_jax.UsageTypeError: non-float inputs, non-bool mask or ``return_packed``,
        unknown keywords.

    References:
      Ma et al. 2021, "Luna: Linear Unified Nested Attention", NeurIPS, §3 (pack and unpack
      attention); code XuezheMax/fairseq-apollo ``LunarMultiheadAttention``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import luna_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> p = jax.random.normal(jax.random.key(1), (8, 4, 16))
      >>> y, p_next = luna_attention(q, k, v, packed_query=p, return_packed=True)
      >>> y.shape, p_next.shape
      ((2, 128, 4, 16), (2, 8, 4, 16))
    """
    method = "luna_attention"
    _checks.boolean(f"{method}()", "return_packed", return_packed)
    packed_query, p = _prepare(
        method, query, key, value, bias, mask, packed_query, scale, is_causal,
        query_seq_lengths, key_value_seq_lengths, head_chunk_size, flax_kwargs)
    check_value_dim(method, query, value)
    packed = _common.poison_invalid(
        summarise(method, packed_query, key, value, p.key_valid, scale=p.scale,
                  head_chunk_size=head_chunk_size), p.mask_ok)
    out = read_summary(method, query, packed, p.query_valid, scale=p.scale,
                       head_chunk_size=head_chunk_size)
    out = _common.poison_invalid(out, p.mask_ok).astype(query.dtype)
    if return_packed:
        return out, packed.astype(query.dtype)
    return out
