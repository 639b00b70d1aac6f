"""Pieces every attention method shares: argument checks, mask reduction, per-head lifting.

Each method's math is written once for a single head on ``(length, head_dim)`` arrays and
lifted here with ``jax.vmap`` over heads and batch, so the per-head code never sees a layout.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Keywords that Flax's ``attention_fn`` callers pass; the approximate methods have no
# attention-weight dropout (there is no weight matrix to drop), so these are accepted and
# ignored. ``nnx.MultiHeadAttention`` always passes all of them.
FLAX_KWARGS = frozenset(
    {
        "dropout_rng",
        "dropout_rate",
        "broadcast_dropout",
        "deterministic",
        "dtype",
        "precision",
        "module",
        "query_seq_lengths",
        "key_value_seq_lengths",
    }
)


def check_flax_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    """Raises TypeError for keywords that are neither the method's nor Flax's."""
    unknown = sorted(set(kwargs) - FLAX_KWARGS)
    if unknown:
        raise TypeError(
            f"{method}() got unexpected keyword argument(s) {unknown}; besides its own "
            f"parameters it accepts only Flax's attention_fn keywords {sorted(FLAX_KWARGS)}."
        )


def check_call(
    method: str, query: Array, key: Array, value: Array, bias: Array | None, is_causal: bool,
    flax_kwargs: dict[str, Any], *, causal_ok: bool = False,
) -> None:
    """The checks every approximate method starts with: keywords, layout, bias, causality."""
    check_flax_kwargs(method, flax_kwargs)
    check_qkv(method, query, key, value)
    reject_bias(method, bias)
    if not causal_ok:
        reject_causal(method, is_causal)


def check_qkv(method: str, query: Array, key: Array, value: Array) -> None:
    """Validates the (batch..., length, heads, head_dim) layout of query, key and value."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "ndim") or x.ndim < 3:
            raise ValueError(
                f"{method}(): `{name}` must have shape (batch..., length, heads, head_dim) "
                f"with at least 3 dims; got shape {getattr(x, 'shape', type(x))}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{method}(): `{name}` must be a floating array; got dtype {x.dtype}.")
    if query.ndim != key.ndim or key.ndim != value.ndim:
        raise ValueError(
            f"{method}(): query, key and value must have the same rank; got shapes "
            f"{query.shape}, {key.shape}, {value.shape}."
        )
    if query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]:
        raise ValueError(
            f"{method}(): batch dims differ: query {query.shape[:-3]}, key {key.shape[:-3]}, "
            f"value {value.shape[:-3]}."
        )
    if key.shape[-3] != value.shape[-3]:
        raise ValueError(
            f"{method}(): key and value lengths differ: {key.shape[-3]} vs {value.shape[-3]}."
        )
    if not (query.shape[-2] == key.shape[-2] == value.shape[-2]):
        raise ValueError(
            f"{method}(): number of heads differs: query {query.shape[-2]}, key "
            f"{key.shape[-2]}, value {value.shape[-2]}."
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"{method}(): query and key head_dim differ: {query.shape[-1]} vs {key.shape[-1]}."
        )


def check_positive_int(method: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        allowed = "a positive int" + (" or None" if allow_none else "")
        raise ValueError(f"{method}(): `{name}` must be {allowed}; got {value!r}.")


def check_choice(method: str, name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{method}(): `{name}` must be one of {allowed}; got {value!r}.")


def reject_bias(method: str, bias: Array | None) -> None:
    if bias is not None:
        raise ValueError(
            f"{method}(): `bias` is not supported (an additive bias needs the full n x n "
            "logit matrix that this method avoids); got an array of shape "
            f"{getattr(bias, 'shape', None)}. Use softmax_attention for biased attention."
        )


def reject_causal(method: str, is_causal: bool) -> None:
    if is_causal:
        raise NotImplementedError(
            f"{method}(): `is_causal=True` is not supported: this method mixes all key "
            "positions into shared landmarks or projections, so it has no causal form. "
            "Causal methods: softmax, linear, performer."
        )


def compute_dtype(dtype: Any) -> Any:
    """float32 or wider: softmax, normalisers and sequence reductions accumulate here."""
    return jnp.promote_types(dtype, jnp.float32)


def default_scale(method: str, scale: Any, head_dim: int) -> Any:
    """``1/sqrt(head_dim)`` for None; a positive number or scalar array otherwise.

    A traced scalar (e.g. a learned temperature) is passed through unchecked.
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, jax.core.Tracer) and jnp.ndim(scale) == 0:
        return scale
    try:
        value = float(scale)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(scale, bool) or jnp.ndim(scale) != 0 or not value > 0:
        raise ValueError(f"{method}(): `scale` must be a positive float or None; got {scale!r}.")
    return value


def padding_from_mask(
    method: str, mask: Array | None, query: Array, key: Array
) -> tuple[Array, Array]:
    """Reduces an attention mask to query and key padding, per batch element and head.

    A padding mask is the outer product ``q_valid[:, None] & k_valid[None, :]`` (what
    ``flax.nnx.make_attention_mask`` builds). It is reduced to
    ``key_valid[k] = any_q mask[q, k]`` and ``query_valid[q] = any_k mask[q, k]``, which
    recovers both exactly. Any other mask (causal, banded, ...) is not a padding mask and
    cannot be honoured by these methods: a concrete mask raises a ValueError at once. A mask
    traced under jit is trusted to be a padding mask, unless the environment variable
    ``SPECTRAL_JAX_CHECK_MASKS=1`` is set when tracing: then it is checked on the device and
    the ValueError is raised from a host callback (one host sync per call).

    Returns:
      ``query_valid`` bool ``(B, H, q_len)`` and ``key_valid`` bool ``(B, H, kv_len)``, with
      the batch dims flattened to ``B``.
    """
    batch_shape = query.shape[:-3]
    q_len, heads = query.shape[-3], query.shape[-2]
    kv_len = key.shape[-3]
    full = (*batch_shape, heads, q_len, kv_len)
    if mask is None:
        b = math.prod(batch_shape)
        return jnp.ones((b, heads, q_len), bool), jnp.ones((b, heads, kv_len), bool)
    mask = as_bool_mask(method, mask)
    if mask.ndim < 2:  # a 1-D mask broadcasts as a key mask
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
    check_mask_shape(method, mask, full)
    # Reduce before broadcasting: a (B, 1, L, L) outer-product mask is never expanded to
    # (B, H, L, L), and XLA fuses the outer product into these reductions.
    q_any = mask.any(axis=-1, keepdims=True)
    k_any = mask.any(axis=-2, keepdims=True)
    is_padding = jnp.all((q_any & k_any) == mask)
    if not isinstance(is_padding, jax.core.Tracer):
        _raise_if_not_padding(method, is_padding)
    elif os.environ.get("SPECTRAL_JAX_CHECK_MASKS") == "1":
        # Under jit the mask is traced and can only be checked on the device, raising from a
        # host callback. That sync cut the quick ListOps run from about 510 to 320 examples/s
        # on CPU, so it is opt-in (read at trace time).
        jax.debug.callback(functools.partial(_raise_if_not_padding, method), is_padding)
    query_valid = jnp.broadcast_to(q_any[..., 0], full[:-1])
    key_valid = jnp.broadcast_to(k_any[..., 0, :], full[:-2] + full[-1:])
    b = math.prod(batch_shape)
    return query_valid.reshape(b, heads, q_len), key_valid.reshape(b, heads, kv_len)


def _raise_if_not_padding(method: str, is_padding: Any) -> None:
    if not bool(is_padding):
        raise ValueError(
            f"{method}(): `mask` must be a padding mask (q_valid[:, None] & k_valid[None, :], "
            "as built by flax.nnx.make_attention_mask); got a mask that is not an outer "
            "product, e.g. causal or banded. Use is_causal=True with a causal method, or "
            "softmax_attention for arbitrary masks."
        )


def check_mask_shape(
    method: str, mask: Array, full: tuple[int, ...], name: str = "mask"
) -> None:
    if mask.ndim > len(full) or any(m not in (1, f) for m, f in zip(mask.shape[::-1], full[::-1])):
        raise ValueError(
            f"{method}(): `{name}` of shape {mask.shape} does not broadcast to "
            f"(batch..., heads, q_len, kv_len) = {full}."
        )


def as_bool_mask(method: str, mask: Any) -> Array:
    """A boolean mask, True = attend; numeric masks (Flax's default float 1/0) are nonzero."""
    mask = jnp.asarray(mask)
    if mask.dtype == jnp.bool_:
        return mask
    if not (jnp.issubdtype(mask.dtype, jnp.integer) or jnp.issubdtype(mask.dtype, jnp.floating)):
        raise TypeError(
            f"{method}(): `mask` must be boolean or numeric (nonzero = attend); got {mask.dtype}."
        )
    return mask != 0


def lift(
    per_head: Callable[..., Array],
    query: Array,
    key: Array,
    value: Array,
    query_valid: Array,
    key_valid: Array,
    *per_head_args: Array,
) -> Array:
    """Applies ``per_head(q, k, v, q_valid, k_valid, *args)`` to every batch element and head.

    ``query`` is ``(batch..., n, H, d)``; ``query_valid``/``key_valid`` are ``(B, H, len)`` with
    batch flattened. Each of ``per_head_args`` has leading dims ``(B, H)``. The per-head
    function is vmapped with axis names ``"batch"`` and ``"heads"``.
    """
    batch_shape = query.shape[:-3]
    b = math.prod(batch_shape)
    q = query.reshape(b, *query.shape[-3:])
    k = key.reshape(b, *key.shape[-3:])
    v = value.reshape(b, *value.shape[-3:])
    over_heads = jax.vmap(
        per_head, in_axes=(1, 1, 1, 0, 0) + (0,) * len(per_head_args), out_axes=1,
        axis_name="heads",
    )
    over_batch = jax.vmap(over_heads, axis_name="batch")
    out = over_batch(q, k, v, query_valid, key_valid, *per_head_args)
    return out.reshape(*batch_shape, *out.shape[1:])


def masked_softmax(logits: Array, valid: Array, axis: int = -1) -> Array:
    """Softmax over ``valid`` entries only; rows with no valid entry give zeros (not NaN).

    ``jax.nn.softmax(where=...)`` has a custom derivative that keeps only its output for the
    backward pass, so an (n, m) kernel costs one saved array, not four.
    """
    return jax.nn.softmax(logits, axis=axis, where=valid)


def fold_in_rng(rng: Array, num_batch: int, num_heads: int) -> Array:
    """One key per (batch element, head), independent of how many others share the call.

    ``fold_in`` by index (rather than ``split`` by count) keeps example 0's key the same when
    more examples join the batch, so outputs never depend on batch composition.
    """
    batch_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.arange(num_batch))
    return jax.vmap(
        lambda key: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_heads))
    )(batch_keys)
