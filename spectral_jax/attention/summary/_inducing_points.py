"""Set Transformer's induced set attention: attend through m inducing points, H = Attn(I, K, V)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._prologue import prologue

Array = jax.Array


def _attend_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, *, scale: Any
) -> Array:
    """softmax(q kᵀ · scale) v over valid keys for one head; padded or key-less rows give 0.

    Computed in the widest of the three dtypes (float32 at least): float32 learned summary
    queries must not round float64 keys and values down.
    """
    ct = _common.compute_dtype(jnp.promote_types(q.dtype, jnp.promote_types(k.dtype, v.dtype)))
    q, k, v = q.astype(ct), k.astype(ct), v.astype(ct)
    weights = _common.masked_softmax((q * scale) @ k.T, k_valid[None, :])
    return jnp.where(q_valid[:, None], weights @ v, 0.0)


def _summarise_head(
    s: Array, k: Array, v: Array, s_valid: Array, k_valid: Array, *, scale: Any
) -> Array:
    """:func:`_attend_head` with the sequence as the keys: on a split sequence the softmax's
    normaliser and the weighted sum of values are reduced over the shards (l·(d_v + 2)
    numbers per head)."""
    ct = _common.compute_dtype(jnp.promote_types(s.dtype, jnp.promote_types(k.dtype, v.dtype)))
    s, k, v = s.astype(ct), k.astype(ct), v.astype(ct)
    weights = _seq.softmax((s * scale) @ k.T, k_valid[None, :])
    return jnp.where(s_valid[:, None], _seq.total(weights @ v), 0.0)


def check_summary_queries(method: str, name: str, summary: Any, query: Array) -> Array:
    """Validates the (l, heads, head_dim) or (batch..., l, heads, head_dim) short sequence.

    A heads axis of 1 is shared by every head (what the registry's pure state builders
    draw, since they do not know the head count). Returns it broadcast to
    ``(batch..., l, heads, head_dim)`` of ``query``'s batch shape.
    """
    batch_shape, heads, head_dim = query.shape[:-3], query.shape[-2], query.shape[-1]
    if not hasattr(summary, "ndim") or summary.ndim not in (3, query.ndim):
        raise UsageError(
            f"{method}(): `{name}` must have shape (length, heads, head_dim) or (batch..., "
            f"length, heads, head_dim) = (..., {heads}, {head_dim}); got shape "
            f"{getattr(summary, 'shape', type(summary))}."
        )
    if not jnp.issubdtype(summary.dtype, jnp.floating):
        raise UsageTypeError(
            f"{method}(): `{name}` must be a floating array; got dtype {summary.dtype}.")
    if (summary.shape[-2] not in (1, heads) or summary.shape[-1] != head_dim
            or summary.shape[-3] < 1
            or (summary.ndim == query.ndim and summary.shape[:-3] != batch_shape)):
        raise UsageError(
            f"{method}(): `{name}` must have shape (length >= 1, {heads} or 1, {head_dim}) or "
            f"({', '.join(map(str, batch_shape))}, length >= 1, {heads} or 1, {head_dim}) to "
            f"match "
            f"query {query.shape}; got shape {summary.shape}."
        )
    return jnp.broadcast_to(summary, batch_shape + (summary.shape[-3], heads, head_dim))


def check_value_dim(method: str, query: Array, value: Array) -> None:
    # The summary H = Attn(·, K, V) has V's width and is read back as keys by the queries.
    if value.shape[-1] != query.shape[-1]:
        raise UsageError(
            f"{method}(): `value` head_dim must equal query's ({query.shape[-1]}): the summary "
            f"Attn(·, K, V) is attended to as keys; got value head_dim {value.shape[-1]}."
        )


def summarise(
    method: str, summary_queries: Array, key: Array, value: Array, key_valid: Array, *,
    scale: Any, head_chunk_size: int | None,
) -> Array:
    """H = softmax(S Kᵀ · scale) V per head over valid keys: ``(batch..., l, heads, d_v)``, float32.

    Every summary row is a query here; a row of an example with no valid key is zero.
    """
    b, heads, length = key_valid.shape[0], key_valid.shape[1], summary_queries.shape[-3]
    ones = jnp.ones((b, heads, length), bool)
    return _common.lift(
        functools.partial(_summarise_head, scale=scale), summary_queries, key, value, ones,
        key_valid, method=method, head_chunk_size=head_chunk_size)


def read_summary(
    method: str, query: Array, summary: Array, query_valid: Array, *, scale: Any,
    head_chunk_size: int | None,
) -> Array:
    """softmax(Q Hᵀ · scale) H per head: ``(batch..., n, heads, d)``; padded queries give 0."""
    b, heads, length = query_valid.shape[0], query_valid.shape[1], summary.shape[-3]
    ones = jnp.ones((b, heads, length), bool)
    return _common.lift(
        functools.partial(_attend_head, scale=scale), query, summary, summary, query_valid,
        ones, method=method, head_chunk_size=head_chunk_size)


@_common.drop_in_signature
def inducing_points_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    inducing_points: Array,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Induced set attention through m inducing points, in O(n·m·d) time and memory.

    Per head, with inducing points I (m × d) and s = ``scale``, two softmax attentions:

        H = softmax(s · I Kᵀ) V            (m × d_v: the inducing points read the keys)
        out = softmax(s · Q Hᵀ) H          (n × d_v: the queries read H, as keys and values)

    This is the Set Transformer's ISAB_m(X) = MAB(X, MAB(I, X)) with the attention cores only:
    the paper's MABs also project I, X and H per block (W_q, W_k, W_v), add residuals and
    layer norms and an rFF; those parameters belong to a module, which passes the projected
    arrays here. The reference code scales the logits by 1/√(model dim); here the default
    is the per-head 1/√head_dim. The softmax over keys in the first step is taken over valid
    keys only, so padded keys never reach H; padded queries give zero rows, and an example
    with no valid key has H = 0 and zero outputs. Since H mixes all keys, there is no
    causal form.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``; bf16 in, bf16 out (float32 inside,
        also for H).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, head_dim)`` (H is read as keys, so the value
        width must equal the query's).
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      inducing_points: float ``(m, heads, head_dim)`` (shared by the batch, as the learned I)
        or ``(batch..., m, heads, head_dim)``; a heads axis of 1 is shared by every head.
        The paper uses m = 16 or 32.
      scale: logit scale of both steps, default ``1/sqrt(head_dim)``.
      is_causal: must be False.

    Returns:
      ``(batch..., q_len, heads, head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes (including ``inducing_points`` and a value width
        other than the query's), ``bias`` given, a mask that is not a padding mask.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).
      spectral_jax.UsageTypeError: non-float inputs, non-bool mask, unknown keywords.

    References:
      Lee et al. 2019, "Set Transformer: A Framework for Attention-based Permutation-Invariant
      Neural Networks", ICML, §3.1 (MAB) and §3.2 (ISAB); code juho-lee/set_transformer.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import inducing_points_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> points = jax.random.normal(jax.random.key(1), (16, 4, 16))
      >>> inducing_points_attention(q, k, v, inducing_points=points).shape
      (2, 128, 4, 16)
    """
    method = "inducing_points_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    check_value_dim(method, query, value)
    points = check_summary_queries(method, "inducing_points", inducing_points, query)
    _checks.positive_int(f"{method}()", "head_chunk_size", head_chunk_size, allow_none=True)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    summary = summarise(method, points, key, value, p.key_valid, scale=p.scale,
                        head_chunk_size=head_chunk_size)
    out = read_summary(method, query, summary, p.query_valid, scale=p.scale,
                       head_chunk_size=head_chunk_size)
    return _common.poison_invalid(out, p.mask_ok).astype(query.dtype)

