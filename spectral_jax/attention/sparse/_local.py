"""Local (sliding-window, band) attention, computed block-wise without an n x n matrix."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _alignment, _common, _segments, _seq
from spectral_jax.attention.core._prologue import prologue

Array = jax.Array


def _local_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
    q_segments: Array | None = None, k_segments: Array | None = None, *,
    scale: Any, sides: tuple[int, int], is_causal: bool,
) -> Array:
    left, right_keys = sides  # keys i - left .. i + right_keys
    reach = max(1, left, right_keys)
    ct = _common.compute_dtype(q.dtype)
    n = q.shape[0]
    # Blocks of `block` tokens: the keys within `reach` of any query of block t lie in
    # blocks t-1, t, t+1 (t-1, t when causal), as block >= reach unless one block covers all.
    block = min(reach, n)
    num_blocks = -(-n // block)
    pad = num_blocks * block - n
    q = jnp.where(q_valid[:, None], q.astype(ct), 0.0) * scale
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    v = v.astype(ct)
    right = 0 if is_causal else block
    q_blocks = jnp.pad(q, ((0, pad), (0, 0))).reshape(num_blocks, block, -1)
    # One block of keys before the sequence and (bidirectional) one after it: zeros and
    # invalid on one device; on a split sequence, the neighbouring shards' edge tokens (a
    # halo of `block` = window tokens each way; the shard length is a multiple of it).
    before = _seq.from_previous((k[n - block:], v[n - block:], k_valid[n - block:]))
    after = _seq.from_next((k[:right], v[:right], k_valid[:right]))
    edges = (jnp.arange(-block, 0), n + jnp.arange(right))  # the edge tokens' positions

    def neighbours(x: Array, first: Array, last: Array) -> Array:
        # (num_blocks, span, ...): the keys of blocks t-1..t+1 next to query block t.
        pad_rows = jnp.zeros((pad,) + x.shape[1:], x.dtype)
        x = jnp.concatenate([first, x, pad_rows, last])
        x = x.reshape(num_blocks + 1 + right // block, block, *x.shape[1:])
        parts = [x[shift:shift + num_blocks] for shift in range(1 + 1 + right // block)]
        return jnp.concatenate(parts, axis=1)

    k_near, v_near, valid_near, k_pos = (
        neighbours(x, first, last) for x, first, last in zip(
            (k, v, k_valid, jnp.arange(n)), (*before, edges[0]), (*after, edges[1])))
    q_pos = jnp.arange(num_blocks)[:, None] * block + jnp.arange(block)[None, :]
    offset = q_pos[:, :, None] - k_pos[:, None, :]  # i - j
    allowed = (offset <= left) & (offset >= -right_keys) & valid_near[:, None, :]
    if is_causal:
        allowed &= offset >= 0
    if q_segments is not None:  # the halo's ids (zeros on one device, where it is invalid)
        near = neighbours(k_segments, _seq.from_previous(k_segments[n - block:]),
                          _seq.from_next(k_segments[:right]))
        mine = jnp.pad(q_segments, (0, pad)).reshape(num_blocks, block)
        allowed &= mine[:, :, None] == near[:, None, :]
    logits = jnp.einsum("tqd,tkd->tqk", q_blocks, k_near)
    weights = _common.masked_softmax(logits, allowed)
    out = jnp.einsum("tqk,tkd->tqd", weights, v_near).reshape(num_blocks * block, -1)[:n]
    return jnp.where(q_valid[:, None], out, 0.0)


def _local_end_aligned_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, *,
    scale: Any, sides: tuple[int, int], is_causal: bool,
) -> Array:
    """q_len < kv_len: query i sits at p − (q_len − 1 − i), p the last valid key.

    Keys after p are invalid, so every query's window lies in keys p − (q_len − 1) − w .. p:
    one slice of q_len + w keys, O(q_len·(q_len + w)) work whatever kv_len is.
    """
    ct = _common.compute_dtype(q.dtype)
    left, right_keys = sides
    reach = max(1, left, right_keys)
    m, n = q.shape[0], k.shape[0]
    last = jnp.max(jnp.where(k_valid, jnp.arange(n), -1))  # -1: no valid key
    size = min(m + reach, n)
    start = jnp.clip(last - (m - 1) - reach, 0, n - size)
    k, v, k_valid = (jax.lax.dynamic_slice_in_dim(x, start, size) for x in (k, v, k_valid))
    q = jnp.where(q_valid[:, None], q.astype(ct), 0.0) * scale
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    offset = (last - (m - 1) + jnp.arange(m))[:, None] - (start + jnp.arange(size))[None, :]
    allowed = (offset <= left) & (offset >= -right_keys) & k_valid[None, :]
    if is_causal:
        allowed &= offset >= 0
    out = _common.masked_softmax(q @ k.T, allowed) @ v.astype(ct)
    return jnp.where(q_valid[:, None], out, 0.0)


@_common.drop_in_signature
def local_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    window: int = 32,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    causal_alignment: str = "top_left",
    segment_ids: Array | None = None,
    query_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Sliding-window attention: query i attends to the valid keys j with ``|i − j| ≤ window``.

        ``out_i = Σ_{j : |i−j| ≤ w} softmax_j(scale · q_i·k_j) v_j``   (causal: i − w ≤ j ≤ i)

    Computed in blocks of w tokens: each query block meets its own and its neighbouring key
    blocks (the previous one only, when causal), so time and memory are O(n·w·d) and no
    n × n matrix is formed. With w ≥ n − 1 this is exact softmax attention (causal or not).
    Positions are absolute; padding must not shift the valid tokens for outputs to be
    independent of it (right padding, as ``*_seq_lengths`` give).

    q_len ≠ kv_len: positions follow ``causal_alignment`` for the window as for causality:
    top-left (query i at key position i, as ``jax.nn``) or bottom-right, where the last
    query sits at the last valid key p of each example and head (query i at
    p − (q_len − 1 − i); with every key valid, kv_len − q_len + i). Flax's
    ``MultiHeadAttention(decode=True)`` call (one query against a cache under a mask, no
    ``is_causal``) is bottom-right whatever ``causal_alignment`` says: its query is the
    token just written, the last slot its mask admits, and decoding token by token then
    equals the causal run.

    Masks: a padding mask, reduced to key and query padding (see
    :func:`nystrom_attention`); padded keys get zero weight, padded query rows are zero, and
    a query with no valid key inside its window gives zeros.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; softmax in
        float32).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: attend only to keys at or behind the query (j ≤ i).
      window: w ≥ 1, keys on each side of the query (LRA's local-attention baseline uses
        blocks of about 50 tokens; w = 32 gives 65 keys).
      local_window_size: None, or jax.nn's window w or (left, right): keys
        i − left ≤ j ≤ i + right; given, it replaces ``window``.
      causal_alignment: ``"top_left"`` or ``"bottom_right"`` (see above).
      segment_ids: optional int ``(batch..., length)`` of packed sequences: a query attends
        only to keys with its id (:mod:`spectral_jax.attention.core._segments`).
      query_segment_ids, kv_segment_ids: the same, given together (q_len == kv_len here).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, q_len > kv_len bottom-right, ``bias`` given,
        ``window`` not a positive int, a bad ``local_window_size`` or ``causal_alignment``,
        or a mask that is not a padding mask.
      spectral_jax.UsageTypeError: non-float inputs, non-bool ``is_causal``, unknown keywords.

    References:
      Local attention as in Parmar et al. 2018, "Image Transformer", ICML, §3.2 and
      Tay et al. 2021, "Long Range Arena", ICLR (the "Local Attention" baseline);
      sliding windows as in idiap/fast-transformers ``LocalAttention`` and Beltagy et al.
      2020, "Longformer", §3.1.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import local_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> local_attention(q, k, v, window=8, is_causal=True).shape
      (2, 128, 4, 16)
    """
    method = "local_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs,
                       mask=mask, causal_ok=True)
    _checks.positive_int(f"{method}()", "window", window)
    sides = _alignment.window_size(method, local_window_size) or (window, window)
    reach = max(1, *sides)  # the halo and block size
    q_len, kv_len = query.shape[-3], key.shape[-3]
    # Flax's decode call without is_causal: the query's position is the slot just written.
    flax_decode = q_len == 1 < kv_len and mask is not None and not is_causal
    bottom_right = _alignment.bottom_right(method, causal_alignment) or flax_decode
    if bottom_right and q_len > kv_len:
        raise UsageError(
            f"{method}(): bottom-right alignment puts the last query at the last valid key "
            f"(query i at p - (q_len - 1 - i)), so q_len must be <= kv_len; got "
            f"q_len={q_len} and kv_len={kv_len}."
        )
    if _seq.active() is not None and (query.shape[-3] != key.shape[-3]
                                      or query.shape[-3] % reach):
        raise UsageError(
            f"{method}(): on a split sequence each shard exchanges a halo of `window` tokens "
            f"with its neighbours, so the shard length must be a multiple of the window (at "
            f"least the window) and "
            f"q_len == kv_len; got window={reach}, shard lengths {query.shape[-3]} "
            f"(queries) and {key.shape[-3]} (keys).")
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=is_causal, bottom_right=bottom_right)
    segments = _segments.resolve(method, query, key, segment_ids, query_segment_ids,
                                 kv_segment_ids, split_ok=True)
    per_head = ()
    if segments is not None:
        if q_len != kv_len:
            raise UsageError(f"{method}(): segment ids need q_len == kv_len here; got "
                             f"q_len={q_len} and kv_len={kv_len}.")
        heads = query.shape[-2]
        per_head = tuple(jnp.broadcast_to(ids[:, None], (ids.shape[0], heads, ids.shape[1]))
                         for ids in segments)
    if q_len == kv_len or not bottom_right:
        # Top-left: the shorter side padded at its end to one length, invalid.
        head = functools.partial(_local_head, scale=p.scale, sides=sides, is_causal=is_causal)
        return _alignment.aligned_lift(
            head, query, key, value, p.query_valid, p.key_valid, *per_head, is_causal=True,
            bottom_right_aligned=False, method=method, mask_ok=p.mask_ok,
            head_chunk_size=head_chunk_size).astype(query.dtype)
    head = functools.partial(_local_end_aligned_head, scale=p.scale, sides=sides,
                             is_causal=is_causal)
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid,
        method=method, mask_ok=p.mask_ok, head_chunk_size=head_chunk_size,
    ).astype(query.dtype)
