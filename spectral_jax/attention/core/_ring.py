"""Ring passes: every shard's key/value block visits every device of the sequence mesh once.

Each device keeps its own queries and, in P steps, sees every shard's keys and values once:
it folds the block it holds into its running result, then hands the block to the next
device (``jax.lax.ppermute``). No device ever holds more than two blocks of n/P tokens, so
memory per device falls as 1/P while the traffic, (P − 1) blocks per device, is the whole
sequence once. The method decides how a block folds in: an online softmax
(``exact._ring``), Skyformer's Gaussian kernel sums.

References:
  Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
  Context", arXiv:2310.01889.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _seq

Array = jax.Array


def ring_blocks(update: Callable[..., Any], carry: Any, k: Array, v: Array,
                k_valid: Array) -> Any:
    """Folds ``update(carry, k_block, v_block, valid_block, block)`` over every key block.

    ``carry`` None: ``update`` is first called with None (the first block starts the sum).

    ``block`` is the shard index the keys come from (their first position is ``block ·
    len(k_block)``). The fold starts with this shard's own block and takes the others in
    ring order, P − 1 ``ppermute`` steps. On one device there is one block, the whole
    sequence.
    """
    shard = _seq.active()
    if shard is None:
        return update(carry, k, v, k_valid, 0)
    p = shard.num_shards
    index = jax.lax.axis_index(shard.axis_name)
    ring = [(i, (i + 1) % p) for i in range(p)]
    block, first = (k, v, k_valid), 0
    if carry is None:  # the own block starts the fold (``update`` takes None first)
        carry = update(None, *block, index)
        block, first = jax.lax.ppermute(block, shard.axis_name, ring), 1

    def step(state, t):
        carry, block = state
        carry = update(carry, *block, (index - t) % p)
        return (carry, jax.lax.ppermute(block, shard.axis_name, ring)), None

    # A scan, each step rematerialised in the backward pass: one step's (n/P) x (n/P)
    # weights are live at a time, whatever P. The last block is folded in after it, so
    # P − 1 blocks move.
    (carry, block), _ = jax.lax.scan(jax.checkpoint(step, prevent_cse=False),
                                     (carry, block), jnp.arange(first, p - 1))
    return update(carry, *block, (index + 1) % p)
