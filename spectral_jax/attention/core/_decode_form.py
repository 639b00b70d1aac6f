"""What one decode form provides (init, prefill, step) and the lift of its per-head cores.

A decode form is the state a causal method carries from token to token (a key/value cache,
a ring buffer, a running feature sum, compressed memory slots). Its cores see one example
and one head; :func:`lift_state` and :func:`lift_step` map them over ``(batch, heads)``.
The public entry points are in :mod:`spectral_jax.attention._decode`. The ring helpers
place a right-padded prompt into a buffer of the last ``size`` positions (local attention's
window, compressed memory's unfinished block).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class DecodeForm(NamedTuple):
    """The three functions of one decode form, on a flattened batch ``B``.

    Attributes:
      init: ``(batch, heads, head_dim, v_head_dim, max_length, dtype, params) -> arrays``:
        the empty state, a dict of ``(B, H, ...)`` arrays.
      prefill: ``(q, k, v, lengths, max_length, params) -> arrays``: the state after each
        example's first ``lengths`` (int ``(B,)``) rows of the right-padded prompts q, k, v
        ``(B, P, H, d)``.
      step: ``(arrays, position, write, q, k, v, params) -> (out, arrays)`` with
        ``position`` int ``(B,)`` (the new token's index), ``write`` bool ``(B,)``, q, k, v
        ``(B, H, d)``; ``out`` is ``(B, H, d_v)``. Examples whose ``write`` is False (a
        padding or refused token) keep their arrays unchanged; the others take the token.
        Stored rows are written in place (:func:`put`), so a step costs no copy of a cache.
      summary: one line for docs and error messages: what the state holds.
      outputs: ``(q, k, v, lengths, params) -> (B, P, H, d_v)``, the prompt's outputs when
        they are not the method's parallel causal call (None: that call).
      uses_fn: the form runs the method's own function (the linear-recurrent family, whose
        function returns its final state): then ``prefill`` is ``(fn, query, key, value,
        lengths, params) -> (out, arrays)`` on the unflattened batch, and ``step`` takes
        ``fn`` first.
      grouped: the query may have a multiple of the state's heads (grouped-query
        attention): the state holds the key/value heads, and a step reads each with its
        query group (:func:`lift_step`), so a cache is 1/groups of the repeated heads'.
    """

    init: Callable[..., dict[str, Array]]
    prefill: Callable[..., tuple[Array, dict[str, Array]]]
    step: Callable[..., tuple[Array, dict[str, Array]]]
    summary: str
    outputs: Callable[..., Array] | None = None
    uses_fn: bool = False
    grouped: bool = False


def lift_step(core: Callable[..., tuple[Array, dict[str, Array]]], arrays: dict[str, Array],
              position: Array, write: Array, q: Array, k: Array, v: Array,
              per_head: dict[str, Array]) -> tuple[Array, dict[str, Array]]:
    """``core(arrays_h, position_b, write_b, q_h, k_h, v_h, per_head_h)`` over batch and heads.

    ``arrays`` and ``per_head`` hold ``(B, H, ...)`` arrays, ``position`` and ``write`` are
    ``(B,)`` and q, k, v are ``(B, H, d)``; the result is ``((B, H, d_v), arrays)``.

    Grouped-query heads: q may have ``G·H`` heads (query head ``h`` reads key/value head
    ``h // G``, as ``jnp.repeat(key, G, axis=-2)`` would pair them); ``core`` then runs once
    per key/value head with its G queries vmapped and the state unbatched, which holds for
    every core whose state update reads only the key and value.
    """
    b, heads = k.shape[:2]
    groups = q.shape[1] // heads
    if groups > 1:
        core = jax.vmap(core, in_axes=(None, None, None, 0, None, None, None),
                        out_axes=(0, None))
        q = q.reshape(b, heads, groups, q.shape[-1])
    over_heads = jax.vmap(core, in_axes=(0, None, None, 0, 0, 0, 0), axis_name="heads")
    out, arrays = jax.vmap(over_heads, axis_name="batch")(arrays, position, write, q, k, v,
                                                          per_head)
    return out.reshape(b, heads * groups, out.shape[-1]), arrays


def put(x: Array, index: Array, row: Array, write: Array) -> Array:
    """``x`` with row ``index`` set to ``row`` where ``write``, else unchanged (in place: only
    that row is read and written; an index past the end is clamped and rewrites itself)."""
    old = jax.lax.dynamic_index_in_dim(x, index, 0, keepdims=False)
    return jax.lax.dynamic_update_index_in_dim(x, jnp.where(write, row.astype(x.dtype), old),
                                               index, 0)


def choose(write: Array, new: dict[str, Array], old: dict[str, Array]) -> dict[str, Array]:
    """``new`` where ``write``, else ``old`` (small running states, selected whole)."""
    return {n: jnp.where(write, new[n], old[n]) for n in new}


def lift_prefill(core: Callable[..., Any], per_head: tuple[Array, ...],
                 per_example: tuple[Array, ...] = ()) -> Any:
    """``core(*per_head_bh, *per_example_b)`` over batch and heads: each of ``per_head`` is
    ``(B, H, ...)``, each of ``per_example`` ``(B, ...)`` (shared by the heads, e.g. the
    prompt lengths)."""
    over_heads = jax.vmap(core, in_axes=(0,) * len(per_head) + (None,) * len(per_example))
    return jax.vmap(over_heads)(*per_head, *per_example)


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
    return jnp.swapaxes(rows, 1, 2)
