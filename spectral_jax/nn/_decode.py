"""MultiHeadAttention's decode mode: its cache and the tokens it decodes, one call at a time.

As in ``flax.nnx.MultiHeadAttention``: ``decode=True`` on the module (or per call),
``init_cache(input_shape, dtype)`` first, then each call takes the next token(s). The cache
is the method's :class:`~spectral_jax.attention.DecodeState` as ``nnx.Cache`` variables
named as Flax names them: ``cached_key`` and ``cached_value`` for stored keys and values,
``cached_<name>`` for the decode form's other arrays (``cached_state``, ``cached_norm``,
``cached_memory_key``, ...), ``cache_index`` (tokens fed so far, Flax's counter), and the
per-example ``cache_position`` and ``cache_ok``; ``cache_max_length`` is an empty
``(max_length, 0)`` array whose shape keeps the state's length under jit and through
Linen's variable collections.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax import attention as _attention
from spectral_jax.attention._decode import decode_form

Array = jax.Array


def check_decode(spec: _attention.AttentionSpec, is_causal: bool) -> None:
    """Raises unless the method decodes and the layer is causal."""
    decode_form(spec, "MultiHeadAttention(decode=True)")
    if not is_causal:
        raise UnsupportedError(
            f"MultiHeadAttention(decode=True) decodes the causal form: pass is_causal=True "
            f"(attention={spec.name!r} with is_causal=False attends to later tokens, which a "
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
    for name, _, _ in layer.method.token_arrays:
        kwargs.pop(name, None)  # per token, not part of the state's layout
    return _attention.init_decode_state(
        layer.method, batch_shape=batch, max_length=max_length, num_heads=layer.num_kv_heads,
        head_dim=layer.head_dim, dtype=dtype, **kwargs)


def cache_name(array: str) -> str:
    """The ``nnx.Cache`` attribute that holds a decode state's array ``array`` (Flax's
    ``cached_key`` and ``cached_value`` for the stored keys and values)."""
    return f"cached_{array}"


def get_cache(layer: Any, name: str) -> Any:
    """The value of the layer's cache variable ``name`` (a Linen bridge may hand it back as
    a plain array)."""
    value = getattr(layer, name)
    return value.get_value() if isinstance(value, nnx.Variable) else value


def set_cache(layer: Any, **values: Any) -> None:
    """Sets the layer's cache variables, creating those it lacks as ``nnx.Cache``."""
    for name, value in values.items():
        current = getattr(layer, name, None)
        if isinstance(current, nnx.Cache):
            current.set_value(value)
        else:  # explicitly data: a bridge may have left the name as a plain attribute
            setattr(layer, name, nnx.data(nnx.Cache(value)))


def store(layer: Any, state: Any) -> None:
    """Writes ``state`` into the layer's cache variables."""
    set_cache(layer, **{cache_name(n): a for n, a in state.arrays.items()},
              cache_position=state.position, cache_ok=state.ok,
              cache_max_length=jnp.zeros((state.max_length, 0), jnp.int8))


def load(layer: Any) -> Any:
    """The layer's :class:`DecodeState`, from its cache variables."""
    arrays = {n.removeprefix("cached_"): get_cache(layer, n) for n in sorted(vars(layer))
              if n.startswith("cached_")}
    return _attention.DecodeState(
        layer.attention, get_cache(layer, "cache_max_length").shape[0],
        get_cache(layer, "cache_position"), get_cache(layer, "cache_ok"), arrays)


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
    if not hasattr(layer, "cache_index"):
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
    state = load(layer)
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
    store(layer, state)
    set_cache(layer, cache_index=get_cache(layer, "cache_index") + query.shape[-3])
    return x
