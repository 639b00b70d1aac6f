"""Decode forms that keep keys and values: softmax's KV cache and local attention's ring buffer.

Both attend with a softmax (float32) over the stored keys the new query may see: every
written slot for the cache, the last ``window + 1`` positions for the ring buffer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError
from spectral_jax.attention import _common
from spectral_jax.attention._decode_form import DecodeForm, lift_step, put

Array = jax.Array


def _attend(q: Array, keys: Array, values: Array, valid: Array, scale: Any) -> Array:
    """softmax(scale·q·kᵀ) v over the ``valid`` rows of one head's stored keys (zeros if none)."""
    ct = _common.compute_dtype(q.dtype)
    logits = keys.astype(ct) @ q.astype(ct) * scale
    return _common.masked_softmax(logits, valid) @ values.astype(ct)


def _scale(params: dict[str, Any], head_dim: int) -> Any:
    return _common.default_scale("decode_step", params.get("scale"), head_dim)


def _zeros(batch: int, heads: int, rows: int, head_dim: int, v_head_dim: int,
           dtype: Any) -> dict[str, Array]:
    return {"key": jnp.zeros((batch, heads, rows, head_dim), dtype),
            "value": jnp.zeros((batch, heads, rows, v_head_dim), dtype)}


def _per_head(x: Array) -> Array:
    """``(B, P, H, d)`` -> ``(B, H, P, d)``."""
    return jnp.swapaxes(x, 1, 2)


# -- softmax: the key/value cache ------------------------------------------------------------

def _cache_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del params
    return _zeros(batch, heads, max_length, head_dim, v_head_dim, dtype)


def _cache_prefill(q, k, v, lengths, max_length, params):
    del q, params
    written = jnp.arange(k.shape[1])[None, :] < lengths[:, None]  # (B, P)

    def fill(x: Array) -> Array:
        x = jnp.where(written[:, :, None, None], x, jnp.zeros_like(x))
        return jnp.pad(_per_head(x), ((0, 0), (0, 0), (0, max_length - x.shape[1]), (0, 0)))

    return {"key": fill(k), "value": fill(v)}


def _cache_step(arrays, position, write, q, k, v, params):
    scale = _scale(params, q.shape[-1])

    def core(state, pos, write1, q1, k1, v1, _):
        keys = put(state["key"], pos, k1, write1)
        values = put(state["value"], pos, v1, write1)
        valid = jnp.arange(keys.shape[0]) <= pos
        return _attend(q1, keys, values, valid, scale), {"key": keys, "value": values}

    return lift_step(core, arrays, position, write, q, k, v, {})


KV_CACHE = DecodeForm(
    init=_cache_init, prefill=_cache_prefill, step=_cache_step,
    summary="a key/value cache of max_length slots: O(max_length·d) per head, each step "
            "attends to every written slot",
    grouped=True)


# -- local: a ring buffer of the last window + 1 positions -----------------------------------

def _window(params: dict[str, Any]) -> int:
    return int(params["window"])


def _ring_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del max_length
    return _zeros(batch, heads, _window(params) + 1, head_dim, v_head_dim, dtype)


def ring_positions(last: Array, size: int) -> Array:
    """The position each of ``size`` ring slots holds once position ``last`` is written
    (slot ``s`` holds the latest ``p ≤ last`` with ``p ≡ s`` mod ``size``; < 0: empty)."""
    slots = jnp.arange(size)
    return last - (last - slots) % size


def ring_prefill(x: Array, lengths: Array, size: int) -> Array:
    """``(B, P, H, d)`` prompt -> ``(B, H, size, d)`` ring after its first ``lengths`` rows."""
    held = jax.vmap(ring_positions, in_axes=(0, None))(lengths - 1, size)  # (B, size)
    rows = jnp.take_along_axis(x, jnp.clip(held, 0, x.shape[1] - 1)[:, :, None, None], axis=1)
    rows = jnp.where((held >= 0)[:, :, None, None], rows, jnp.zeros_like(rows))
    return _per_head(rows)


def _ring_prefill(q, k, v, lengths, max_length, params):
    del q, max_length
    size = _window(params) + 1
    return {"key": ring_prefill(k, lengths, size), "value": ring_prefill(v, lengths, size)}


def _ring_step(arrays, position, write, q, k, v, params):
    size = _window(params) + 1
    if arrays["key"].shape[-2] != size:
        raise UsageError(
            f"decode_step(): the local ring buffer holds {arrays['key'].shape[-2]} positions "
            f"(window={arrays['key'].shape[-2] - 1}), but window={size - 1} was passed; "
            "decode with the window the state was built with.")
    scale = _scale(params, q.shape[-1])

    def core(state, pos, write1, q1, k1, v1, _):
        slot = pos % size
        keys = put(state["key"], slot, k1, write1)
        values = put(state["value"], slot, v1, write1)
        valid = ring_positions(pos, size) >= 0
        return _attend(q1, keys, values, valid, scale), {"key": keys, "value": values}

    return lift_step(core, arrays, position, write, q, k, v, {})


RING_BUFFER = DecodeForm(
    init=_ring_init, prefill=_ring_prefill, step=_ring_step,
    summary="a ring buffer of the last window + 1 keys and values: O(window·d) per head, "
            "whatever the context length",
    grouped=True)
