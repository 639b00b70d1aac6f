"""The decode form of the linear-recurrent family: the (d_k, d_v) state itself.

Prefill runs the method's chunked form over the prompt and keeps its final state; a step
runs the same function on one token from that state (a chunk of one token is the
recurrence's own step), so every method of the family and its gates decode through one
form, in O(d_k·d_v) per head and token whatever the context length. With grouped-query heads
the state is one per key/value head, shared by its query group, as in the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core._decode_form import DecodeForm, choose

Array = jax.Array

# Parameters the decode form sets itself.
_SET_HERE = ("initial_state", "return_final_state")


def _call_params(params: dict[str, Any]) -> dict[str, Any]:
    return {n: x for n, x in params.items() if n not in _SET_HERE and x is not None}


def _init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del max_length, dtype, params
    return {"state": jnp.zeros((batch, heads, head_dim, v_head_dim), jnp.float32)}


def _prefill(fn: Callable[..., Any], query: Array, key: Array, value: Array,
             lengths: Array, params: dict[str, Any]) -> tuple[Array, dict[str, Array]]:
    out, state = fn(query, key, value, query_seq_lengths=lengths,
                    key_value_seq_lengths=lengths, return_final_state=True,
                    **_call_params(params))
    return out, {"state": state.astype(jnp.float32)}


def _step(fn: Callable[..., Any], arrays: dict[str, Array], position: Array, write: Array,
          q: Array, k: Array, v: Array, params: dict[str, Any]) -> tuple[Array, dict[str, Array]]:
    del position
    params = {n: x for n, x in _call_params(params).items() if n != "segment_ids"}
    out, state = fn(q[:, None], k[:, None], v[:, None], initial_state=arrays["state"],
                    return_final_state=True, **params)
    new = {"state": state.astype(jnp.float32)}
    return out[:, 0], choose(write.reshape(-1, 1, 1, 1), new, arrays)


RECURRENT_STATE = DecodeForm(
    init=_init, prefill=_prefill, step=_step, uses_fn=True,
    summary="the recurrent state S (d_k×d_v, float32) per head, decayed and written by each "
            "token: O(d_k·d_v) per head, whatever the context length",
    grouped=True)
