"""Memory-compressed attention (Liu et al. 2018): exact attention over strided-conv memory."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._hints import cached_decode_hint
from spectral_jax.attention.core._prologue import prologue

Array = jax.Array


def mean_pool_conv(kernel_size: int, dim: int, dtype: Any = jnp.float32) -> Array:
    """Convolution weights ``(kernel_size, dim, dim)`` that average each window: ``I / k`` per tap.

    The identity-like start of the learned weights and the benchmarks' stand-in for trained
    ones; with ``kernel_size = 1`` memory compression is the identity.

    Example:
      >>> from spectral_jax.attention import mean_pool_conv
      >>> mean_pool_conv(2, 3)[1]
      Array([[0.5, 0. , 0. ],
             [0. , 0.5, 0. ],
             [0. , 0. , 0.5]], dtype=float32)
    """
    _checks.positive_int("mean_pool_conv()", "kernel_size", kernel_size)
    return jnp.broadcast_to(jnp.eye(dim, dtype=dtype) / kernel_size, (kernel_size, dim, dim))


def compress_memory(
    x: Array, valid: Array, conv: Array, stride: int
) -> tuple[Array, Array]:
    """Strided 1-D convolution along the length, per head, with padded positions zeroed first.

    Slot j covers positions ``j·stride .. j·stride + kernel − 1`` (the part past the end is
    zero), for j < ⌈n / stride⌉, and is ``Σ_t x[j·stride + t] @ conv[t]``.

    Args:
      x: float ``(B, n, H, d)`` (batch flattened).
      valid: bool ``(B, H, n)``.
      conv: ``(kernel, d, d_out)`` shared by the heads, or ``(H, kernel, d, d_out)``.
      stride: ≥ 1.

    Returns:
      ``(memory (B, m, H, d_out) in float32 or wider, slot_last int32 (B, H, m))``:
      ``slot_last`` is the last valid position a slot covers, −1 for a slot made only of
      padding (which is then masked).
    """
    ct = _common.compute_dtype(x.dtype)
    n = x.shape[1]
    kernel = conv.shape[-3]
    slots = -(-n // stride)
    x = jnp.where(jnp.swapaxes(valid, 1, 2)[..., None], x.astype(ct), 0.0)
    if _seq.active() is None:
        extra = max((slots - 1) * stride + kernel - n, 0)
        x = jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0)))
        valid = jnp.pad(valid, ((0, 0), (0, 0), (0, extra)))
        first, position = 0, jnp.arange(n + extra)
    else:
        # A split sequence: this shard makes the slots that start on it (the first at the
        # first multiple of the stride), reading the next shard's first kernel − 1 tokens
        # where a window crosses the edge (zeros after the last shard). Slots that would
        # start past the shard are marked empty; all shards' slots are then gathered.
        halo = kernel - 1
        x = jnp.concatenate([x, _seq.from_next(x[:, :halo])], axis=1)
        valid = jnp.concatenate([valid, _seq.from_next(valid[:, :, :halo])], axis=2)
        first = (-_seq.offset(n)) % stride
        position = _seq.offset(n) + jnp.arange(n + halo)
    starts = first + stride * jnp.arange(slots)
    index = starts[:, None] + jnp.arange(kernel)[None, :]  # (m, kernel)
    windows = x[:, index]  # (B, m, kernel, H, d)
    spec = "bmthd,tde->bmhe" if conv.ndim == 3 else "bmthd,htde->bmhe"
    memory = jnp.einsum(spec, windows, conv.astype(ct), precision=jax.lax.Precision.HIGHEST)
    last = jnp.where(valid, position, -1)[:, :, index].max(-1).astype(jnp.int32)
    last = jnp.where(starts < n, last, -1)
    return _seq.gather(memory, axis=1), _seq.gather(last, axis=2)


def _memory_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, slot_last: Array, *,
    scale: Any, is_causal: bool,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    q = jnp.where(q_valid[:, None], q.astype(ct), 0.0) * scale
    allowed = jnp.broadcast_to(k_valid[None, :], (q.shape[0], k.shape[0]))
    if is_causal:
        # A slot mixes its valid positions (padding is zero), so it may be seen once the
        # last of them is: then no slot carries a token later than the query.
        position = _seq.offset(q.shape[0]) + jnp.arange(q.shape[0])
        allowed &= slot_last[None, :] <= position[:, None]
    out = _common.masked_softmax(q @ k.T, allowed) @ v
    return jnp.where(q_valid[:, None], out, 0.0)


def _check_causal_lengths(method: str, is_causal: bool, query: Array, key: Array) -> None:
    """Causal memory compression needs q_len == kv_len: against a cache (one decoding query,
    later slots masked) the slot holding the newest tokens is incomplete, and a slot cut
    short by the mask is indistinguishable from one cut short by padding, so the step
    cannot reproduce the causal run, which sees complete slots only."""
    if is_causal and query.shape[-3] != key.shape[-3]:
        raise UsageError(
            f"{method}(): is_causal=True needs q_len == kv_len; got q_len={query.shape[-3]} "
            f"and kv_len={key.shape[-3]}. A query against a key/value cache (e.g. Flax's "
            "MultiHeadAttention(decode=True)) would see the newest memory slot incomplete, "
            "which the causal form never does. Decode with spectral_jax.attention.decode_step "
            "or spectral_jax.nn.MultiHeadAttention(decode=True), which keep the memory "
            f"slots. {cached_decode_hint()}"
        )


def _check_conv(method: str, name: str, conv: Any, heads: int, dim: int) -> Array:
    shape = getattr(conv, "shape", None)
    ok = shape is not None and (
        (len(shape) == 3 and shape[1:] == (dim, dim))
        or (len(shape) == 4 and shape[0] == heads and shape[2:] == (dim, dim))
    ) and shape[-3] >= 1
    if not ok:
        raise UsageError(
            f"{method}(): `{name}` must be the convolution weights, shape (kernel, {dim}, "
            f"{dim}) shared by the heads or ({heads}, kernel, {dim}, {dim}) per head; got "
            f"{shape if shape is not None else conv!r}."
        )
    if not jnp.issubdtype(conv.dtype, jnp.floating):
        raise UsageTypeError(f"{method}(): `{name}` must be a float array; got dtype {conv.dtype}.")
    return conv


@_common.drop_in_signature
def memory_compressed_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    key_conv: Array | None = None,
    value_conv: Array | None = None,
    stride: int | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Memory-compressed attention: exact softmax attention over a strided convolution of K and V.

        K̃ = conv_s(K; W_K),  Ṽ = conv_s(V; W_V),  out = softmax(scale · Q K̃ᵀ) Ṽ,

    where conv_s is a 1-D convolution along the length with kernel size k (the first axis
    of the weights) and stride s (default k), computed per head, without bias, into
    m = ⌈n/s⌉ memory slots. Padded keys and values are zeroed before the convolution and a
    slot made only of padding is masked, so padded content never reaches a valid output
    (slots are positional: right padding keeps them, as ``*_seq_lengths`` give). O(n·(n/s)·d)
    time and memory. The weights are arguments: the Flax module owns and learns them. With
    kernel = stride = 1 and identity weights this is exact softmax attention.

    ``is_causal=True``: slot j (positions js .. js+k−1) is seen by query i only once all its
    valid positions are (the last of them ≤ i), as in mesh-tensorflow's memory-compressed
    attention (there: js + k − 1 ≤ i); queries before the first complete slot (i < k − 1
    without padding) see no key and give zeros.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; convolution,
        softmax and normalisers in float32).
      key: float ``(batch..., kv_len, kv_heads, head_dim)``; ``kv_heads`` divides ``heads``
        (grouped-query attention: each key/value head's slots are made once and read by
        its query group; ``heads`` below means ``kv_heads`` for the convolutions).
      value: float ``(batch..., kv_len, kv_heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: causal form (q_len must equal kv_len: one query against a key/value
        cache is refused, causal or not, see Raises;
        :func:`~spectral_jax.attention.decode_step` decodes from the memory slots).
      key_conv: float ``(kernel, head_dim, head_dim)`` shared by the heads, or
        ``(heads, kernel, head_dim, head_dim)``: W_K, required. The paper uses kernel 3.
      value_conv: ``(kernel, v_head_dim, v_head_dim)`` or ``(heads, kernel, v_head_dim,
        v_head_dim)``: W_V, required, same kernel as ``key_conv``.
      stride: s ≥ 1, default the kernel size (3 in the paper).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias`` given, missing or mis-shaped ``key_conv`` /
        ``value_conv``, kernels that differ, ``stride`` not a positive int, causal with
        q_len != kv_len (also one decoding query against a cache: the newest slot would be
        incomplete), or a mask that is not a padding mask.
      spectral_jax.UnsupportedError: one query against more keys under a mask, causal or not:
        the call of Flax's ``MultiHeadAttention(decode=True)``, whose mask cuts the newest
        slot short (one padded query: pass ``key_value_seq_lengths``).
      spectral_jax.UsageTypeError: non-float inputs or weights, unknown keywords.

    References:
      Liu et al. 2018, "Generating Wikipedia by Summarizing Long Sequences", ICLR, §4.2.3
      (memory-compressed attention); mesh-tensorflow
      ``multihead_self_attention_memory_compressed`` (causal slot rule).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import memory_compressed_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> w = jax.random.normal(jax.random.key(1), (3, 16, 16)) / jnp.sqrt(3 * 16)
      >>> memory_compressed_attention(q, k, v, key_conv=w, value_conv=w).shape
      (2, 128, 4, 16)
    """
    method = "memory_compressed_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs,
                       mask=mask, causal_ok=True)
    heads = key.shape[-2]
    key_conv = _check_conv(method, "key_conv", key_conv, heads, key.shape[-1])
    value_conv = _check_conv(method, "value_conv", value_conv, heads, value.shape[-1])
    kernel = key_conv.shape[-3]
    if value_conv.shape[-3] != kernel:
        raise UsageError(
            f"{method}(): `key_conv` and `value_conv` must share the kernel size; got "
            f"{kernel} and {value_conv.shape[-3]}."
        )
    stride = kernel if stride is None else stride
    _checks.positive_int(f"{method}()", "stride", stride)
    _check_causal_lengths(method, is_causal, query, key)
    if _seq.active() is not None and kernel - 1 > key.shape[-3]:
        raise UsageError(
            f"{method}(): on a split sequence a memory slot may reach into the next shard "
            f"only, so kernel_size - 1 must be at most the shard length; got kernel_size="
            f"{kernel} and {key.shape[-3]} keys per shard.")
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=is_causal)
    batch_shape = query.shape[:-3]
    b = math.prod(batch_shape)
    flat = lambda x: x.reshape(b, *x.shape[-3:])  # noqa: E731
    # The slots are made once per key/value head; a query group reads its head's slots.
    key_valid, mask_ok = _common.key_head_valid(method, p.key_valid, heads, p.mask_ok)
    memory_k, slot_last = compress_memory(flat(key), key_valid, key_conv, int(stride))
    memory_v, _ = compress_memory(flat(value), key_valid, value_conv, int(stride))
    unflat = lambda x: x.reshape(*batch_shape, *x.shape[1:])  # noqa: E731
    head = functools.partial(_memory_head, scale=p.scale, is_causal=is_causal)
    groups = query.shape[-2] // heads
    return _common.lift(
        head, query, unflat(memory_k), unflat(memory_v), p.query_valid,
        jnp.repeat(slot_last >= 0, groups, axis=1), key_args=(slot_last,),
        method=method, mask_ok=mask_ok, head_chunk_size=head_chunk_size,
    ).astype(query.dtype)
