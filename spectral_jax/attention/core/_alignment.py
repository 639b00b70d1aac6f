"""Where queries sit among the keys when their lengths differ: the causal alignment.

``is_causal=True`` with q_len ≠ kv_len means what it means in ``jax.nn.dot_product_attention``
and Flax: query i attends to keys j ≤ i (``"top_left"``, the first query lined up with the
first key). Chunked prefill and decoding against a cache need the other convention, query i
at key position kv_len − q_len + i (``"bottom_right"``, the last query lined up with the last
key), which every method with a causal form takes as ``causal_alignment="bottom_right"``.

    ==============  ===========================  ======================================
    alignment       query i sits at key position  used by
    ==============  ===========================  ======================================
    top_left        i                             jax.nn, Flax, the default here
    bottom_right    kv_len − q_len + i            prefill of a later chunk, decoding
    ==============  ===========================  ======================================
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError
from spectral_jax.attention.core import _common

Array = jax.Array

ALIGNMENTS = ("top_left", "bottom_right")


def bottom_right(method: str, causal_alignment: Any) -> bool:
    """Whether ``causal_alignment`` is ``"bottom_right"``; checks it is one of ALIGNMENTS.

    Raises:
      spectral_jax.UsageError: any other value.
    """
    if causal_alignment not in ALIGNMENTS:
        raise UsageError(f"{method}(): `causal_alignment` must be one of {list(ALIGNMENTS)}; "
                         f"got {causal_alignment!r}.")
    return causal_alignment == "bottom_right"


def _offsets(q_len: int, kv_len: int, bottom_right_aligned: bool) -> Array:
    """int ``(q_len, kv_len)``: query i's position minus key j's."""
    position = jnp.arange(q_len)[:, None] + (kv_len - q_len if bottom_right_aligned else 0)
    return position - jnp.arange(kv_len)[None, :]


def causal_mask(q_len: int, kv_len: int, bottom_right_aligned: bool) -> Array:
    """bool ``(q_len, kv_len)``: query i may see key j."""
    return _offsets(q_len, kv_len, bottom_right_aligned) >= 0


def window_size(method: str, local_window_size: Any) -> tuple[int, int] | None:
    """``local_window_size`` as jax.nn reads it: None, w (= (w, w)) or (left, right) ≥ 0.

    Raises:
      spectral_jax.UsageError: anything else.
    """
    if local_window_size is None:
        return None
    pair = ((local_window_size, local_window_size) if isinstance(local_window_size, int)
            else tuple(local_window_size) if isinstance(local_window_size, (tuple, list))
            else None)
    if (pair is None or len(pair) != 2 or any(isinstance(w, bool) or not isinstance(w, int)
                                              or w < 0 for w in pair)):
        raise UsageError(
            f"{method}(): `local_window_size` must be None, an int w >= 0 or a pair (left, "
            f"right) of ints >= 0 (keys i - left .. i + right, as jax.nn); got "
            f"{local_window_size!r}.")
    return pair


def window_mask(q_len: int, kv_len: int, window: tuple[int, int],
                bottom_right_aligned: bool) -> Array:
    """bool ``(q_len, kv_len)``: jax.nn's sliding window, query i sees keys
    i − left ≤ j ≤ i + right (positions per the alignment)."""
    offset = _offsets(q_len, kv_len, bottom_right_aligned)
    return (offset <= window[0]) & (offset >= -window[1])


def aligned_lift(head: Any, query: Array, key: Array, value: Array, q_valid: Array,
                 k_valid: Array, *per_head_args: Array, is_causal: bool,
                 bottom_right_aligned: bool, **lift_kwargs: Any) -> Array:
    """:func:`_common.lift` for a causal ``head`` written for q_len == kv_len.

    The shorter of queries and keys is padded to the longer one (zeros, marked invalid):
    at the end for top-left alignment, at the front for bottom-right, so that query i meets
    key j at the positions the alignment gives; the padded queries' outputs are cut off.
    """
    q_len, kv_len = query.shape[-3], key.shape[-3]
    if not is_causal or q_len == kv_len:
        return _common.lift(head, query, key, value, q_valid, k_valid, *per_head_args,
                            **lift_kwargs)
    assert not per_head_args, "per-head arguments come with q_len == kv_len only"
    length = max(q_len, kv_len)

    def pad(x: Array, axis: int) -> Array:
        extra = length - x.shape[axis]
        widths = [(0, 0)] * x.ndim
        widths[axis] = (extra, 0) if bottom_right_aligned else (0, extra)
        return jnp.pad(x, widths)

    q_axis = query.ndim - 3
    query, key, value = pad(query, q_axis), pad(key, q_axis), pad(value, q_axis)
    q_valid, k_valid = pad(q_valid, 2), pad(k_valid, 2)
    out = _common.lift(head, query, key, value, q_valid, k_valid, **lift_kwargs)
    start = length - q_len if bottom_right_aligned else 0
    return jax.lax.slice_in_dim(out, start, start + q_len, axis=q_axis)
