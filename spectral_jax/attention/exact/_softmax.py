"""Exact softmax attention: the reference every approximation is measured against."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UnsupportedError, UsageError, _checks
from spectral_jax.attention.core import _alignment, _common, _padding, _segments, _seq
from spectral_jax.attention.exact import _ring

Array = jax.Array


def _causal_and(mask: Array | None, q_len: int, kv_len: int, bottom_right: bool) -> Array:
    return _and(mask, _alignment.causal_mask(q_len, kv_len, bottom_right))


def _and(mask: Array | None, allowed: Array) -> Array:
    """``mask & allowed`` for ``allowed`` ``(q_len, kv_len)``, at any rank promotion setting."""
    if mask is None:
        return allowed
    return jnp.logical_and(mask, allowed.reshape((1,) * (mask.ndim - 2) + allowed.shape))


def _repeat_heads(query: Array, x: Array) -> Array:
    """Key or value heads repeated to the query heads: head h serves query heads
    h·G .. h·G + G − 1, jax.nn's grouping."""
    return jnp.repeat(x, query.shape[-2] // x.shape[-2], axis=-2)


def _window_and(mask: Array | None, q_len: int, kv_len: int, window: tuple[int, int],
                bottom_right: bool) -> Array:
    return _and(mask, _alignment.window_mask(q_len, kv_len, window, bottom_right))


def _dropout_rate(method: str, flax_kwargs: dict[str, Any]) -> Any:
    """The attention-weight dropout rate, or None when dropout is off; checks the keywords.

    On when ``dropout_rate > 0`` and not ``deterministic``, as in
    ``flax.nnx.dot_product_attention``. A concrete rate must lie in [0, 1); a scalar rate
    traced under jit (e.g. a schedule) is used as given, since ``jax.random.bernoulli``
    takes a traced probability.
    """
    rate = flax_kwargs.get("dropout_rate")
    if rate is None:
        return None
    if isinstance(rate, jax.core.Tracer):
        if jnp.ndim(rate) != 0 or not jnp.issubdtype(rate.dtype, jnp.floating):
            raise UsageError(
                f"{method}(): `dropout_rate` must be a float scalar; got a traced array of "
                f"shape {jnp.shape(rate)} and dtype {rate.dtype}.")
    else:
        rate = _checks.number(f"{method}()", "dropout_rate", rate, low=0.0,
                              what="a finite float >= 0")
        if rate >= 1.0:
            raise UsageError(f"{method}(): `dropout_rate` must be in [0, 1); got {rate!r}.")
        if rate == 0.0:
            return None
    if flax_kwargs.get("deterministic", False):
        return None
    rng = flax_kwargs.get("dropout_rng")
    if rng is None:
        raise UsageError(
            f"{method}(): dropout_rate={rate} with deterministic=False needs `dropout_rng` "
            "(a jax.random key); got None."
        )
    _common.check_single_key(method, "dropout_rng", rng)
    return rate


def _dropout_multiplier(method: str, flax_kwargs: dict[str, Any], shape: tuple[int, ...]
                        ) -> Array | None:
    """Flax's attention-weight dropout: None when off, else keep / (1 − rate), float32.

    ``broadcast_dropout`` (default True) shares one mask over the batch and head dims.
    """
    rate = _dropout_rate(method, flax_kwargs)
    if rate is None:
        return None
    rng = flax_kwargs["dropout_rng"]
    if flax_kwargs.get("broadcast_dropout", True):
        shape = (1,) * (len(shape) - 2) + shape[-2:]
    keep = jax.random.bernoulli(rng, 1.0 - rate, shape)
    return keep.astype(jnp.float32) / (1.0 - rate)


@_common.drop_in_signature
def softmax_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    implementation: str | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    causal_alignment: str = "top_left",
    segment_ids: Array | None = None,
    query_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Exact scaled dot-product attention, softmax(q kᵀ · scale + bias) v.

    Built on ``jax.nn.dot_product_attention`` (so ``implementation="cudnn"`` gives fused
    flash attention on NVIDIA GPUs), with one change: a query row with no valid key gives
    zeros instead of the uniform average that the XLA path returns.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``; bf16, f16, f32 or f64.
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: optional additive logit bias broadcastable to ``(batch, heads, q_len, kv_len)``.
      mask: optional bool, True = attend, broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale; default ``1/sqrt(head_dim)``.
      is_causal: if True, query i attends to keys j <= i (top-left, as jax.nn; see
        ``causal_alignment``).
      implementation: passed to ``jax.nn.dot_product_attention`` (None, "xla" or "cudnn").
      query_seq_lengths: optional int ``(batch...,)``: only the first ``query_seq_lengths``
        queries of each example are valid (combined with ``mask``).
      key_value_seq_lengths: optional int ``(batch...,)``: only the first
        ``key_value_seq_lengths`` keys and values of each example are valid.
      local_window_size: None, w or (left, right): query i attends only to keys
        i − left ≤ j ≤ i + right, as in ``jax.nn.dot_product_attention``.
      causal_alignment: ``"top_left"`` (default, as jax.nn and Flax) or ``"bottom_right"``
        (query i at key position kv_len − q_len + i, as in decoding), for the causal mask and
        the window when q_len ≠ kv_len (:mod:`spectral_jax.attention.core._alignment`).
      segment_ids: optional int ``(batch..., length)`` of packed sequences (self-attention):
        a query attends only to keys with its id (:mod:`spectral_jax.attention.core._segments`).
      query_segment_ids, kv_segment_ids: the same for q_len ≠ kv_len, given together.
      **flax_kwargs: Flax ``attention_fn`` keywords. ``dropout_rate``, ``dropout_rng``,
        ``deterministic`` and ``broadcast_dropout`` drop attention weights as
        ``flax.nnx.dot_product_attention`` does (then the weights are formed explicitly);
        ``module`` (Flax's ``sow_weights=True``) sows the weights before dropout as Flax
        does (``attention_weights`` in the module's intermediates); ``dtype`` and
        ``precision`` are accepted and ignored.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype. Softmax runs in float32.

    Raises:
      spectral_jax.UsageError: mismatched shapes, a non-positive scale, a mask that does not
        broadcast, segment ids of another shape or not int, or dropout without
        ``dropout_rng`` or with a rate outside [0, 1).
      spectral_jax.UsageTypeError: non-float inputs, a non-boolean mask or an unknown keyword.

    References:
      Vaswani et al. 2017, "Attention is all you need", eq. (1).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import softmax_attention
      >>> q = k = v = jnp.ones((2, 16, 4, 8))
      >>> softmax_attention(q, k, v, is_causal=True).shape
      (2, 16, 4, 8)
    """
    method = "softmax_attention"
    _common.check_flax_kwargs(method, flax_kwargs, dropout_ok=True)
    # Sowing needs the weights themselves, which the explicit path forms.
    dropout = (_dropout_rate(method, flax_kwargs) is not None
               or flax_kwargs.get("module") is not None)
    _common.check_qkv(method, query, key, value, grouped_ok=True)
    _checks.boolean(f"{method}()", "is_causal", is_causal)
    bottom_right = _alignment.bottom_right(method, causal_alignment)
    window = _alignment.window_size(method, local_window_size)
    scale = _common.default_scale(method, scale, query.shape[-1])
    segments = _segments.resolve(method, query, key, segment_ids, query_segment_ids,
                                 kv_segment_ids, split_ok=True)
    if _seq.active() is not None:
        if window is not None:
            raise UnsupportedError(
                f"{method}(): `local_window_size` on a split sequence is not implemented; "
                "use local_attention, whose shard form exchanges a halo.")
        return _ring_attention(method, query, key, value, scale, is_causal, dropout, segments)
    # Grouped heads are repeated here only: the ring above passes the H_kv heads alone.
    if query.shape[-2] != key.shape[-2]:
        key, value = _repeat_heads(query, key), _repeat_heads(query, value)
    q_len, kv_len = query.shape[-3], key.shape[-3]
    batch_shape = query.shape[:-3]
    full = (*batch_shape, query.shape[-2], q_len, kv_len)
    if mask is not None:
        mask = _padding.as_bool_mask(method, mask)
        _padding.check_mask_shape(method, mask, full)
    if bias is not None:
        _padding.check_mask_shape(method, jnp.asarray(bias), full, name="bias")
    q_prefix = _padding.seq_lengths_valid(method, "query_seq_lengths", query_seq_lengths,
                                         batch_shape, q_len)
    k_prefix = _padding.seq_lengths_valid(method, "key_value_seq_lengths",
                                         key_value_seq_lengths, batch_shape, kv_len)
    # Folded into the mask as (batch..., 1, q_len, 1) and (batch..., 1, 1, kv_len).
    for prefix in (None if q_prefix is None else q_prefix[..., None, :, None],
                   None if k_prefix is None else k_prefix[..., None, None, :]):
        if prefix is not None:
            mask = prefix if mask is None else mask & prefix
    if segments is not None:
        same = _segments.mask(segments, batch_shape)
        mask = same if mask is None else mask & same
    if is_causal:
        # Folded into the mask so the empty-row check below sees it too.
        mask = _causal_and(mask, q_len, kv_len, bottom_right)
    if window is not None:
        mask = _window_and(mask, q_len, kv_len, window, bottom_right)
    if mask is not None:
        # A key no query may see still enters P @ V as 0 * v: zero it, so that inf or NaN in
        # padding never reaches a valid output.
        # Reduced before broadcasting: a key padding mask stays O(kv_len) here.
        mask_nd = mask.reshape((1,) * (len(full) - mask.ndim) + mask.shape)
        used = jnp.broadcast_to(mask_nd.any(axis=-2), full[:-2] + full[-1:])
        value = jnp.where(jnp.swapaxes(used, -1, -2)[..., None], value, jnp.zeros_like(value))
    dtype = jnp.result_type(query, key, value)
    # jax.nn.dot_product_attention wants one dtype, v_head_dim == head_dim, and no float64;
    # everything else goes through the explicit reference (same semantics).
    # Dropout needs the weights themselves, which the explicit path forms.
    if dtype == jnp.float64 or value.shape[-1] != query.shape[-1] or not (
        query.dtype == key.dtype == value.dtype
    ) or dropout:
        return reference_attention(query, key, value, bias, mask, scale=scale,
                                   **flax_kwargs).astype(dtype)
    flat = lambda x: x.reshape(-1, *x.shape[-3:])  # noqa: E731  jax.nn wants one batch dim
    flat_mask = None if mask is None else jnp.broadcast_to(mask, full).reshape(-1, *full[-3:])
    flat_bias = None if bias is None else jnp.broadcast_to(bias, full).reshape(-1, *full[-3:])
    out = jax.nn.dot_product_attention(
        flat(query), flat(key), flat(value), bias=flat_bias, mask=flat_mask, scale=scale,
        implementation=implementation,
    ).reshape(*batch_shape, q_len, query.shape[-2], value.shape[-1])
    if flat_mask is None:
        return out
    has_key = flat_mask.any(axis=-1)  # (B, H, q_len)
    has_key = jnp.swapaxes(has_key, -1, -2).reshape(*batch_shape, q_len, query.shape[-2], 1)
    return jnp.where(has_key, out, jnp.zeros_like(out))


def _ring_attention(method: str, query: Array, key: Array, value: Array, scale: Any,
                    is_causal: bool, dropout: bool,
                    segments: _segments.Segments | None) -> Array:
    """One shard of a sequence split over devices: ring attention over the padding that
    :func:`spectral_jax.parallel.sequence_parallel` computed on the global arrays."""
    if dropout:
        raise UnsupportedError(
            f"{method}(): attention-weight dropout on a split sequence is not implemented "
            "(the weights are never formed whole); use dropout_rate=0 or deterministic=True.")
    query_valid, key_valid, mask_ok, _ = _seq.active().padding
    head = functools.partial(_ring.ring_softmax_head, scale=scale, is_causal=is_causal)
    heads = query.shape[-2]
    ids = () if segments is None else tuple(  # this shard's ids, (B, H, n) each
        jnp.broadcast_to(x[:, None], (x.shape[0], heads, x.shape[1])) for x in segments)
    return _common.lift(head, query, key, value, query_valid, key_valid, *ids, method=method,
                        head_chunk_size=None, mask_ok=mask_ok).astype(query.dtype)


@_common.drop_in_signature
def reference_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    **flax_kwargs: Any,
) -> Array:
    """Explicit O(n²) attention in the inputs' own precision (float64 under ``jax.enable_x64``).

    Materialises the full weight matrix with ``Precision.HIGHEST`` einsums; the tests use it
    in float64 as ground truth. Same arguments, shapes and semantics as
    :func:`softmax_attention` (rows with no valid key give zeros, Flax's dropout keywords
    drop weights); not for production use.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import reference_attention
      >>> q = k = v = jnp.ones((1, 8, 2, 4))
      >>> reference_attention(q, k, v).shape
      (1, 8, 2, 4)
    """
    method = "reference_attention"
    _common.check_flax_kwargs(method, flax_kwargs, dropout_ok=True)
    _common.check_qkv(method, query, key, value, grouped_ok=True)
    key, value = _repeat_heads(query, key), _repeat_heads(query, value)
    scale = _common.default_scale(method, scale, query.shape[-1])
    ct = _common.compute_dtype(query.dtype)
    hi = jax.lax.Precision.HIGHEST
    logits = jnp.einsum("...qhd,...khd->...hqk", query.astype(ct), key.astype(ct), precision=hi)
    logits = logits * scale
    if bias is not None:
        logits = logits + jnp.asarray(bias, ct)
    if mask is None:
        valid = jnp.ones(logits.shape, bool)
    else:
        mask = _padding.as_bool_mask(method, mask)
        _padding.check_mask_shape(method, mask, logits.shape)
        valid = jnp.broadcast_to(mask, logits.shape)
    if is_causal:
        valid = _causal_and(valid, query.shape[-3], key.shape[-3], bottom_right=False)
    weights = _common.masked_softmax(logits, valid)
    if flax_kwargs.get("module") is not None:
        _sow(flax_kwargs["module"], weights)
    multiplier = _dropout_multiplier(method, flax_kwargs, logits.shape)
    if multiplier is not None:
        weights = weights * multiplier.astype(ct)
    out = jnp.einsum("...hqk,...khd->...qhd", weights, value.astype(ct), precision=hi)
    return out.astype(query.dtype)


def _sow(module: Any, weights: Array) -> None:
    """Flax's ``sow_weights``: the weights ``(batch..., heads, q_len, kv_len)`` under
    ``attention_weights`` in the module's intermediates, as ``flax.nnx`` / ``flax.linen``'s
    ``dot_product_attention_weights`` store them."""
    from flax import nnx

    collection = nnx.Intermediate if isinstance(module, nnx.Module) else "intermediates"
    module.sow(collection, "attention_weights", weights)
