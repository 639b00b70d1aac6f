"""MultiHeadAttention's decode mode: its cache and the tokens it decodes, one call at a time.

As in ``flax.nnx.MultiHeadAttention``: ``decode=True`` on the module (or per call),
``init_cache(input_shape, dtype)`` first, then each call takes the next token(s). The cache
is one ``nnx.Cache`` holding the method's :class:`~spectral_jax.attention.DecodeState`
(``decode_state``) plus ``cache_index``, the number of tokens fed so far, as Flax keeps it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UnsupportedError, UsageError
from spectral_jax import attention as _attention
from spectral_jax.attention._decode import decode_form

Array = jax.Array


def check_decode(attention: str, is_causal: bool) -> None:
    """Raises unless the method decodes and the layer is causal."""
    decode_form(attention, "MultiHeadAttention(decode=True)")
    if not is_causal:
        raise UnsupportedError(
            f"MultiHeadAttention(decode=True) decodes the causal form: pass is_causal=True "
            f"(attention={attention!r} with is_causal=False attends to later tokens, which a "
            "decoder has not seen).")


def init_state(layer: Any, input_shape: tuple[int, ...], dtype: Any) -> Any:
    """The empty :class:`DecodeState` for inputs ``(batch..., max_length, in_features)``."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) < 2 or shape[-1] != layer.in_features:
        raise UsageError(
            f"MultiHeadAttention.init_cache: `input_shape` must be (batch..., max_length, "
            f"in_features) with in_features={layer.in_features}; got {input_shape}.")
    batch, max_length = shape[:-2], shape[-2]
    kwargs = state_kwargs(layer, jnp.zeros((*batch, 1, layer.in_features), dtype))
    for name, _, _ in _attention.get_attention_spec(layer.attention).token_arrays:
        kwargs.pop(name, None)  # per token, not part of the state's layout
    return _attention.init_decode_state(
        layer.attention, batch_shape=batch, max_length=max_length, num_heads=layer.num_kv_heads,
        head_dim=layer.head_dim, dtype=dtype, **kwargs)


def state_kwargs(layer: Any, inputs: Array) -> dict[str, Any]:
    """The method's keyword arguments: the layer's ``attention_kwargs`` and its state's."""
    kwargs = dict(layer.attention_kwargs)
    if layer.state is not None:
        kwargs.update(layer.state(kv_len=1, deterministic=True, inputs=inputs))
    return kwargs


def token_valid(valid: Array | None, batch: tuple[int, ...], length: int) -> Array:
    """bool ``(batch..., length)`` from the call's ``valid`` (None: every token)."""
    if valid is None:
        return jnp.ones((*batch, length), bool)
    valid = jnp.asarray(valid)
    if valid.dtype != jnp.bool_ or valid.shape not in ((*batch, length), batch):
        raise UsageError(
            f"MultiHeadAttention(decode=True): `valid` must be bool (batch...,) or (batch..., "
            f"q_len) = {(*batch, length)}; got {valid.dtype} {valid.shape}.")
    return valid if valid.shape == (*batch, length) else valid[..., None]


def positions(state: Any, valid: Array) -> Array:
    """int32 ``(batch..., q_len)``: each token's position, its example's count of earlier
    valid tokens (a padding token gets the position the next valid one will have)."""
    before = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - valid.astype(jnp.int32)
    return state.position[..., None] + before


def decode_tokens(state: Any, query: Array, key: Array, value: Array, valid: Array,
                  kwargs: dict[str, Any]) -> tuple[Array, Any]:
    """Feeds the ``q_len`` tokens of ``(batch..., q_len, heads, d)`` inputs one by one."""
    # The per-token arguments (gates, g, β, Δ) travel with their token.
    spec = _attention.get_attention_spec(state.method)
    tokens = {name: (kwargs.pop(name), axis) for name, axis, batched in spec.token_arrays
              if batched and kwargs.get(name) is not None}
    if query.shape[-3] == 1:
        out, state = _attention.decode_step(state, query, key, value, valid=valid[..., 0],
                                            **kwargs, **{n: x for n, (x, _) in tokens.items()})
        return out, state
    axis = query.ndim - 3
    xs = [jnp.moveaxis(x, axis, 0)[:, ..., None, :, :] for x in (query, key, value)]
    xs.append(jnp.moveaxis(valid, -1, 0))
    per_token = {n: jnp.moveaxis(x, x.ndim + a, 0) for n, (x, a) in tokens.items()}

    def body(state, token):
        q, k, v, ok, extra = token
        extra = {n: jnp.expand_dims(x, x.ndim + tokens[n][1] + 1) for n, x in extra.items()}
        y, state = _attention.decode_step(state, q, k, v, valid=ok, **kwargs, **extra)
        return state, y
    state, ys = jax.lax.scan(body, state, (*xs, per_token))
    return jnp.moveaxis(ys[..., 0, :, :], 0, axis), state


def decode_inputs(layer: Any, query: Array, cross: bool, mask: Array | None,
                  deterministic: bool, valid: Array | None) -> tuple[Any, Array]:
    """The layer's cached state and the tokens' validity ``(batch..., q_len)``, checked."""
    if not hasattr(layer, "decode_state"):
        raise UsageError("MultiHeadAttention(decode=True): call init_cache(input_shape, "
                         "dtype) before decoding.")
    if cross or mask is not None:
        raise UsageError(
            "MultiHeadAttention(decode=True) decodes self-attention from its cache: "
            "inputs_kv and mask must be None (mark padding tokens with valid=).")
    if layer.dropout_rate and not deterministic:
        raise UnsupportedError(
            f"MultiHeadAttention(decode=True): weight dropout (dropout_rate="
            f"{layer.dropout_rate}) is for training; decode with deterministic=True.")
    state = layer.decode_state.get_value()
    batch = query.shape[:-3]
    if batch != state.position.shape:
        raise UsageError(
            f"MultiHeadAttention(decode=True): the cache was built for batch "
            f"{state.position.shape}; got inputs of batch {batch} (call init_cache again).")
    return state, token_valid(valid, batch, query.shape[-3])


def decode_call(layer: Any, state: Any, inputs: Array, query: Array, key: Array,
                value: Array, valid: Array) -> Array:
    """Feeds the call's tokens through the layer's cache; the attention output, before the
    output projection."""
    x, state = decode_tokens(state, query, key, value, valid, state_kwargs(layer, inputs))
    layer.decode_state.set_value(state)
    layer.cache_index.set_value(layer.cache_index.get_value() + query.shape[-3])
    return x
