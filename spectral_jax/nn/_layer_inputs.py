"""What :class:`~spectral_jax.nn.MultiHeadAttention` hands its attention core: the inputs
projected to heads, the paper layer's short convolution, and rotary positions.

Order matters and is the papers': project (and normalise, ``normalize_qk``), convolve (the
recurrent family's layer, which sees positions only through its causal taps), then rotate
queries and keys by their positions (RoFormer), so that every method attends rotated q, k.
In decode mode the positions are each example's own count of earlier valid tokens.
"""

from __future__ import annotations

from typing import Any

import jax

from spectral_jax import attention as _attention
from spectral_jax.nn import _decode, _projections
from spectral_jax.nn._recurrent_layer import convolve
from spectral_jax.nn._rope import apply_rope

Array = jax.Array


def core_inputs(layer: Any, inputs_q: Array, inputs_kv: Array, inputs_v: Array | None, *,
                mask: Array | None, positions: Array | None, decode: bool,
                deterministic: bool, valid: Array | None, segment_ids: Array | None
                ) -> tuple[Array, Array, Array, Array | None, Any, Array | None]:
    """``(query, key, value, mask, decode_state, valid)`` for the layer's core.

    ``mask`` comes back as bool (Flax's masks are float 1/0); ``decode_state`` and ``valid``
    (bool ``(batch..., q_len)``) are None unless ``decode``.

    Raises:
      spectral_jax.UsageError: as :func:`spectral_jax.nn._decode.decode_inputs` in decode
        mode; a mask that is not 0/1.
    """
    query, key, value = _projections.project(
        layer, inputs_q, inputs_kv, inputs_kv if inputs_v is None else inputs_v)
    state = None
    if decode:
        state, valid = _decode.decode_inputs(layer, query, inputs_kv is not inputs_q, mask,
                                             deterministic, valid)
        positions = _decode.positions(state, valid) if positions is None else positions
    else:
        valid = None
        if mask is not None:
            mask = _attention.as_bool_mask("MultiHeadAttention", mask)
    if layer.layer_parts is not None:
        query, key, value = convolve(layer, query, key, value, mask, valid, segment_ids)
    if positions is None and segment_ids is not None:  # restarting per document
        positions = _attention.segment_positions(segment_ids)
    if layer.rope:
        query = apply_rope(query, positions)
        key = apply_rope(key, positions if key.shape[-3] == query.shape[-3] else None)
    return query, key, value, mask, state, valid
