"""The checks an attention function starts with: its keywords, the (batch..., length, heads,
head_dim) layout with grouped heads, bias and causality, and Flax's decode call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _hints
from spectral_jax.attention.core._hints import cached_decode_hint, causal_methods_hint
from spectral_jax.attention.core._kwargs import check_flax_kwargs

Array = jax.Array


def check_call(
    method: str, query: Array, key: Array, value: Array, bias: Array | None, is_causal: bool,
    flax_kwargs: dict[str, Any], *, mask: Array | None, causal_ok: bool = False,
    grouped_ok: bool = True,
) -> None:
    """The checks every approximate method starts with: keywords, layout (grouped heads
    where ``grouped_ok``, which :func:`lift` computes per key/value head), bias, Flax's
    decode call (:func:`reject_cache_query`), causality."""
    check_flax_kwargs(method, flax_kwargs)
    check_qkv(method, query, key, value, grouped_ok=grouped_ok)
    reject_bias(method, bias)
    _checks.boolean(f"{method}()", "is_causal", is_causal)
    reject_cache_query(method, query, key, mask)
    if not causal_ok:
        reject_causal(method, is_causal)


def reject_cache_query(method: str, query: Array, key: Array, mask: Array | None) -> None:
    """Refuses Flax's decode call for a registered method that cannot decode from a cache.

    ``flax.nnx.MultiHeadAttention(decode=True)`` (and Linen's) calls ``attention_fn`` with one
    query against its whole key/value cache (kv_len = the cache length) and a mask of the
    slots written so far, ``is_causal`` False unless its caller passes True. Only a method
    whose registry entry has ``cached_decode`` gives that position of its causal run from
    this; another would return something else silently (a bidirectional method's summary of
    the written keys; memory_compressed's newest memory slot cut short by the mask), so it
    raises. Under jit no value can be read, so the call is recognised by its static form:
    q_len == 1 < kv_len with a mask. One query attending to padded keys outside decoding has
    the same form; such a caller passes ``key_value_seq_lengths`` instead of the mask.

    Raises:
      spectral_jax.UnsupportedError: that form, for a registered method without
        ``cached_decode``; the message names the functions that decode from the cache.
    """
    spec = _hints.registered(method)
    if spec is None or spec.cached_decode or mask is None:
        return
    if not query.shape[-3] == 1 < key.shape[-3]:
        return
    if spec.supports_causal:
        reason = ("its causal form reads state that the cache does not hold; decode with "
                  "spectral_jax.attention.decode_step or "
                  "spectral_jax.nn.MultiHeadAttention(decode=True), which carry it")
    else:
        reason = "it has no causal form, so it cannot decode token by token"
    raise UnsupportedError(
        f"{method}(): one query against {key.shape[-3]} keys under a mask is the call Flax's "
        "MultiHeadAttention(decode=True) makes against its key/value cache, which this "
        f"method cannot decode from: {reason}. (One query attending to padded keys outside "
        "decoding: pass key_value_seq_lengths instead of the mask.) "
        f"{cached_decode_hint()}"
    )


def fold_grouped_values(method: str, query: Array, key: Array,
                        value: Array) -> tuple[Array, Callable[[Array], Array]]:
    """Grouped values for a method linear in V: ``value`` with ``H_v = G·H_k`` heads as
    ``H_k`` heads of ``G·d_v`` features, and the function that unfolds the output back to
    ``H_v`` heads of ``d_v`` (value head ``j`` is read with key and query head ``j // G``, as
    in fla's and Mamba-2's grouped values). A method linear in V gives each of the G value
    heads exactly what it would give it alone, while its feature sums and normaliser are
    made once per key head.

    Returns ``(value, identity)`` when the heads are equal; other layouts are left to
    :func:`check_qkv`, which names them.

    Raises:
      spectral_jax.UsageError: grouped values with query heads other than the key heads.
    """
    hk, hv = getattr(key, "shape", (0, 0))[-2], getattr(value, "shape", (0, 0))[-2]
    if getattr(value, "ndim", 0) < 3 or getattr(key, "ndim", 0) < 3 or hv == hk or hv % hk:
        return value, lambda out: out
    if query.shape[-2] != hk:
        raise UsageError(
            f"{method}(): grouped values (value heads {hv}, a multiple of the key heads {hk}) "
            f"need as many query heads as key heads; got query {query.shape[-2]}.")
    d_v = value.shape[-1]
    folded = value.reshape(*value.shape[:-2], hk, (hv // hk) * d_v)
    return folded, lambda out: out.reshape(*out.shape[:-2], hv, d_v)


def check_qkv(method: str, query: Array, key: Array, value: Array, *,
              grouped_ok: bool = False, grouped_values_ok: bool = False) -> None:
    """Validates the (batch..., length, heads, head_dim) layout of query, key and value.

    ``grouped_ok``: the query heads may be a multiple of the key/value heads (GQA / MQA;
    Ainslie et al. 2023), each group of consecutive query heads sharing one key/value head,
    as in ``jax.nn.dot_product_attention``. ``grouped_values_ok``: the value heads may be a
    multiple of the key heads (:func:`fold_grouped_values`; the method checks the rest).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "ndim") or x.ndim < 3:
            raise UsageError(
                f"{method}(): `{name}` must have shape (batch..., length, heads, head_dim) "
                f"with at least 3 dims; got shape {getattr(x, 'shape', type(x))}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise UsageTypeError(
                f"{method}(): `{name}` must be a floating array; got dtype {x.dtype}.")
    if query.ndim != key.ndim or key.ndim != value.ndim:
        raise UsageError(
            f"{method}(): query, key and value must have the same rank; got shapes "
            f"{query.shape}, {key.shape}, {value.shape}."
        )
    if query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]:
        raise UsageError(
            f"{method}(): batch dims differ: query {query.shape[:-3]}, key {key.shape[:-3]}, "
            f"value {value.shape[:-3]}."
        )
    if key.shape[-3] != value.shape[-3]:
        raise UsageError(
            f"{method}(): key and value lengths differ: {key.shape[-3]} vs {value.shape[-3]}."
        )
    heads, kv_heads = query.shape[-2], key.shape[-2]
    values_grouped = grouped_values_ok and kv_heads and value.shape[-2] % kv_heads == 0
    if kv_heads != value.shape[-2] and not values_grouped:
        raise UsageError(
            f"{method}(): key and value head counts differ: key {kv_heads}, value "
            f"{value.shape[-2]}."
        )
    if heads != kv_heads and not (grouped_ok and kv_heads and heads % kv_heads == 0):
        allowed = ("a multiple of the key/value heads (grouped-query attention)" if grouped_ok
                   else "equal to the key/value heads (this form takes no grouped heads)")
        raise UsageError(
            f"{method}(): query heads must be {allowed}; got query {heads}, key/value "
            f"{kv_heads}."
        )
    if query.shape[-1] != key.shape[-1]:
        raise UsageError(
            f"{method}(): query and key head_dim differ: {query.shape[-1]} vs {key.shape[-1]}."
        )
    if query.shape[-3] == 0 or key.shape[-3] == 0:
        raise UsageError(
            f"{method}(): sequence lengths must be >= 1; got q_len={query.shape[-3]}, "
            f"kv_len={key.shape[-3]}."
        )


def check_single_key(method: str, name: str, value: Any) -> None:
    """One ``jax.random`` key: a typed key of shape () or a raw uint32 key of shape (2,)."""
    typed = isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)
    ok = isinstance(value, jax.Array) and (
        (typed and value.shape == ()) or (value.dtype == jnp.uint32 and value.shape == (2,)))
    if not ok:
        raise UsageTypeError(
            f"{method}(): `{name}` must be one jax.random key (jax.random.key(seed)), not a "
            f"batch of keys or another array; got {type(value).__name__} with shape "
            f"{getattr(value, 'shape', None)} and dtype {getattr(value, 'dtype', None)}."
        )


def reject_bias(method: str, bias: Array | None) -> None:
    if bias is not None:
        raise UsageError(
            f"{method}(): `bias` is not supported (an additive bias needs the full n x n "
            "logit matrix that this method avoids); got an array of shape "
            f"{getattr(bias, 'shape', None)}. Use softmax_attention for biased attention."
        )


def reject_causal(method: str, is_causal: bool) -> None:
    if is_causal:
        raise UnsupportedError(
            f"{method}(): `is_causal=True` is not supported: this method mixes all key "
            "positions into shared landmarks or projections, so it has no causal form. "
            f"{causal_methods_hint()}"
        )
