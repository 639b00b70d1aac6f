"""Local attention's decode form: a ring buffer of the last ``window + 1`` positions, read
by the same softmax as softmax's key/value cache."""

from __future__ import annotations

from typing import Any

from spectral_jax import UsageError
from spectral_jax.attention.core._decode_form import (
    DecodeForm,
    lift_step,
    put,
    ring_positions,
    ring_prefill,
)
from spectral_jax.attention.exact._decode import attend, step_scale, zeros

# -- local: a ring buffer of the last window + 1 positions -----------------------------------

def _window(params: dict[str, Any]) -> int:
    return int(params["window"])


def _ring_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del max_length
    return zeros(batch, heads, _window(params) + 1, head_dim, v_head_dim, dtype)


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
    scale = step_scale(params, q.shape[-1])

    def core(state, pos, write1, q1, k1, v1, _):
        slot = pos % size
        keys = put(state["key"], slot, k1, write1)
        values = put(state["value"], slot, v1, write1)
        valid = ring_positions(pos, size) >= 0
        return attend(q1, keys, values, valid, scale), {"key": keys, "value": values}

    return lift_step(core, arrays, position, write, q, k, v, {})


RING_BUFFER = DecodeForm(
    init=_ring_init, prefill=_ring_prefill, step=_ring_step,
    summary="a ring buffer of the last window + 1 keys and values: O(window·d) per head, "
            "whatever the context length",
    grouped=True)
