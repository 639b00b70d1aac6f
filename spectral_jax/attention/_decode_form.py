"""What one decode form provides (init, prefill, step) and the lift of its per-head cores.

A decode form is the state a causal method carries from token to token (a key/value cache,
a ring buffer, a running feature sum, compressed memory slots). Its cores see one example
and one head; :func:`lift_state` and :func:`lift_step` map them over ``(batch, heads)``.
The public entry points are in :mod:`spectral_jax.attention._decode`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Array = jax.Array


class DecodeForm(NamedTuple):
    """The three functions of one decode form, on a flattened batch ``B``.

    Attributes:
      init: ``(batch, heads, head_dim, v_head_dim, max_length, dtype, params) -> arrays``:
        the empty state, a dict of ``(B, H, ...)`` arrays.
      prefill: ``(q, k, v, lengths, max_length, params) -> arrays``: the state after each
        example's first ``lengths`` (int ``(B,)``) rows of the right-padded prompts q, k, v
        ``(B, P, H, d)``.
      step: ``(arrays, position, q, k, v, params) -> (out, arrays)`` with ``position`` int
        ``(B,)`` (the new token's index), q, k, v ``(B, H, d)``; ``out`` is ``(B, H, d_v)``.
        The token is always written: the caller keeps the old arrays of examples whose
        token is padding or refused.
      summary: one line for docs and error messages: what the state holds.
      outputs: ``(q, k, v, lengths, params) -> (B, P, H, d_v)``, the prompt's outputs when
        they are not the method's parallel causal call (None: that call).
    """

    init: Callable[..., dict[str, Array]]
    prefill: Callable[..., tuple[Array, dict[str, Array]]]
    step: Callable[..., tuple[Array, dict[str, Array]]]
    summary: str
    outputs: Callable[..., Array] | None = None


def lift_step(core: Callable[..., tuple[Array, dict[str, Array]]], arrays: dict[str, Array],
              position: Array, q: Array, k: Array, v: Array,
              per_head: dict[str, Array]) -> tuple[Array, dict[str, Array]]:
    """``core(arrays_h, position_b, q_h, k_h, v_h, per_head_h)`` over batch and heads.

    ``arrays`` and ``per_head`` hold ``(B, H, ...)`` arrays, ``position`` is ``(B,)`` and
    q, k, v are ``(B, H, d)``; the result is ``((B, H, d_v), arrays)``.
    """
    over_heads = jax.vmap(core, in_axes=(0, None, 0, 0, 0, 0), axis_name="heads")
    return jax.vmap(over_heads, axis_name="batch")(arrays, position, q, k, v, per_head)


def lift_prefill(core: Callable[..., Any], per_head: tuple[Array, ...],
                 per_example: tuple[Array, ...] = ()) -> Any:
    """``core(*per_head_bh, *per_example_b)`` over batch and heads: each of ``per_head`` is
    ``(B, H, ...)``, each of ``per_example`` ``(B, ...)`` (shared by the heads, e.g. the
    prompt lengths)."""
    over_heads = jax.vmap(core, in_axes=(0,) * len(per_head) + (None,) * len(per_example))
    return jax.vmap(over_heads)(*per_head, *per_example)
