"""Softmax's key/value cache decode form, and the softmax read of stored keys it shares with
local attention's ring buffer (:mod:`spectral_jax.attention.sparse._decode`).

Both attend with a softmax (float32) over the stored keys the new query may see: every
written slot for the cache, the last ``window + 1`` positions for the ring buffer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common
from spectral_jax.attention.core._decode_form import (
    DecodeForm,
    lift_step,
    put,
)

Array = jax.Array


def attend(q: Array, keys: Array, values: Array, valid: Array, scale: Any) -> Array:
    """softmax(scale·q·kᵀ) v over the ``valid`` rows of one head's stored keys (zeros if none)."""
    ct = _common.compute_dtype(q.dtype)
    logits = keys.astype(ct) @ q.astype(ct) * scale
    return _common.masked_softmax(logits, valid) @ values.astype(ct)


def step_scale(params: dict[str, Any], head_dim: int) -> Any:
    return _common.default_scale("decode_step", params.get("scale"), head_dim)


def zeros(batch: int, heads: int, rows: int, head_dim: int, v_head_dim: int,
           dtype: Any) -> dict[str, Array]:
    return {"key": jnp.zeros((batch, heads, rows, head_dim), dtype),
            "value": jnp.zeros((batch, heads, rows, v_head_dim), dtype)}


def _per_head(x: Array) -> Array:
    """``(B, P, H, d)`` -> ``(B, H, P, d)``."""
    return jnp.swapaxes(x, 1, 2)


# -- softmax: the key/value cache ------------------------------------------------------------

def _cache_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del params
    return zeros(batch, heads, max_length, head_dim, v_head_dim, dtype)


def _cache_prefill(q, k, v, lengths, max_length, params):
    del q, params
    written = jnp.arange(k.shape[1])[None, :] < lengths[:, None]  # (B, P)

    def fill(x: Array) -> Array:
        x = jnp.where(written[:, :, None, None], x, jnp.zeros_like(x))
        return jnp.pad(_per_head(x), ((0, 0), (0, 0), (0, max_length - x.shape[1]), (0, 0)))

    return {"key": fill(k), "value": fill(v)}


def _cache_step(arrays, position, write, q, k, v, params):
    scale = step_scale(params, q.shape[-1])

    def core(state, pos, write1, q1, k1, v1, _):
        keys = put(state["key"], pos, k1, write1)
        values = put(state["value"], pos, v1, write1)
        valid = jnp.arange(keys.shape[0]) <= pos
        return attend(q1, keys, values, valid, scale), {"key": keys, "value": values}

    return lift_step(core, arrays, position, write, q, k, v, {})


KV_CACHE = DecodeForm(
    init=_cache_init, prefill=_cache_prefill, step=_cache_step,
    summary="a key/value cache of max_length slots: O(max_length·d) per head, each step "
            "attends to every written slot",
    grouped=True)
