"""Exact softmax attention on a split sequence: the ring passes of ``core._ring`` folded by an
online softmax.

Each device keeps its own queries and folds every shard's key/value block into a running
maximum, normaliser and weighted sum as the blocks pass (:func:`ring_blocks`), so the
result is the one-block softmax while no device holds more than two blocks.

References:
  Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
  Context", arXiv:2310.01889; Milakov & Gimelshein 2018, "Online normalizer calculation for
  softmax" (the streaming normaliser).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._ring import ring_blocks

Array = jax.Array


def ring_softmax_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
    q_ids: Array | None = None, k_ids: Array | None = None, *, scale: Any, is_causal: bool,
) -> Array:
    """Exact softmax attention of one head's query shard against every key, by blocks.

    The running maximum is a stabiliser without a derivative (it cancels between the
    numerator and the normaliser), so values and gradients are those of the one-block
    softmax. Causal: key position ≤ query position, queries and keys at the same global
    positions. Segment ids (``q_ids``, ``k_ids``): a query sees the keys of its id only, the
    keys' ids travelling with their block. Padded queries and queries with no valid key
    give zeros.
    """
    ct = _common.compute_dtype(q.dtype)
    q = q.astype(ct) * scale
    n = q.shape[0]
    q_pos = _seq.offset(n) + jnp.arange(n)

    def update(carry, kb, vb, valid, block):
        top, norm, acc = carry
        if k_ids is not None:
            valid, ids = valid
            valid = valid[None, :] & (ids[None, :] == q_ids[:, None])
        ok = jnp.broadcast_to(valid[None, :] if valid.ndim == 1 else valid, (n, kb.shape[0]))
        if is_causal:
            ok = ok & (block * kb.shape[0] + jnp.arange(kb.shape[0]) <= q_pos[:, None])
        logits = q @ kb.astype(ct).T
        block_top = jax.lax.stop_gradient(jnp.max(jnp.where(ok, logits, -jnp.inf), axis=-1))
        new_top = jnp.maximum(top, block_top)
        safe = jnp.where(jnp.isfinite(new_top), new_top, 0.0)
        weights = jnp.where(ok, jnp.exp(jnp.where(ok, logits, 0.0) - safe[:, None]), 0.0)
        # Rescales what earlier blocks summed to the new stabiliser (1 while nothing was).
        rescale = jnp.exp(jnp.where(jnp.isfinite(top), top, safe) - safe)
        return (new_top, norm * rescale + weights.sum(-1),
                acc * rescale[:, None] + weights @ vb.astype(ct))

    # The carry varies over the shards as the queries do.
    zero = jnp.zeros_like(q_valid, dtype=ct)
    init = (zero - jnp.inf, zero, jnp.zeros((n, v.shape[-1]), ct) + zero[:, None])
    keys = k_valid if k_ids is None else (k_valid, k_ids)
    _, norm, acc = ring_blocks(update, init, k, v, keys)
    out = acc / jnp.where(norm > 0, norm, 1.0)[:, None]
    return jnp.where(q_valid[:, None] & (norm > 0)[:, None], out, 0.0)
