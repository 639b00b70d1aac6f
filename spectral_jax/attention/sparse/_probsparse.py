"""Informer's ProbSparse self-attention: exact attention for the few queries far from uniform."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UnsupportedError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._hints import causal_methods_hint
from spectral_jax.attention.core._landmarks import position_of_rank
from spectral_jax.attention.core._prologue import prologue, slice_keys

Array = jax.Array


def log_budget(factor: int, length: Any) -> Any:
    """``clip(factor·⌈ln length⌉, 1, length)``: Informer's u (queries) and U (sampled keys).

    ``length`` is a Python int (the static shape bound) or a traced count of valid tokens;
    the bound from the padded length is never below the one from the valid count.
    """
    if isinstance(length, int):
        return max(1, min(factor * math.ceil(math.log(max(length, 1))), length))
    count = length.astype(jnp.float32)
    budget = factor * jnp.ceil(jnp.log(jnp.maximum(count, 1.0)))
    return jnp.clip(budget, 1, jnp.maximum(count, 1)).astype(jnp.int32)


def _probsparse_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, candidate: Array,
    rng: Array | None = None, *, scale: Any, factor: int,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    n, n_k = q.shape[0], k.shape[0]
    q = jnp.where(q_valid[:, None], q.astype(ct), 0.0) * scale
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    v = v.astype(ct)
    candidate = candidate & q_valid
    # Budgets follow the valid counts (not the padded length), so an example's output never
    # depends on how far its batch-mates pad it; the static bounds fix the array shapes. All
    # are global on a sequence split over devices.
    n_keys = _seq.total(k_valid.sum())
    num_sample = log_budget(factor, n_keys)
    max_sample = log_budget(factor, _seq.global_length(n_k))
    num_top = log_budget(factor, _seq.total(candidate.sum()))
    max_top = log_budget(factor, _seq.global_length(n))
    column = jnp.arange(max_sample)
    if rng is None:
        # Evenly spaced valid keys, the same for every query (U rows onto every shard).
        ranks = ((2 * column + 1) * n_keys) // (2 * num_sample)
        sampled = q @ _seq.take(k, position_of_rank(k_valid, ranks)).T  # (n, max_sample)
    else:
        # Each query draws its own keys, uniformly with replacement, as Informer does. Draw j
        # of a query comes from the key folded with the query's rank among the valid queries
        # and with j, so the sample never depends on the padded shape or the padding's place.
        query_rank = jnp.cumsum(q_valid) - 1 + _seq.exclusive_prefix(q_valid.sum())

        def draws(rank: Array) -> Array:
            query_key = jax.random.fold_in(rng, rank)
            return jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(query_key, j)))(
                column)

        uniform = jax.vmap(draws)(query_rank)  # (n, max_sample)
        ranks = jnp.minimum(jnp.floor(uniform * n_keys).astype(jnp.int32),
                            jnp.maximum(n_keys - 1, 0))
        # Any key may be drawn by any query: a split sequence gathers every key and its
        # validity (no derivative: the sample only ranks the queries), and each rank is
        # looked up in the whole sequence's running count.
        every_key = _seq.gather(jax.lax.stop_gradient(k), 0)
        every_valid = _seq.gather(k_valid, 0)
        pos = jnp.minimum(
            jnp.searchsorted(jnp.cumsum(every_valid), ranks + 1), every_valid.shape[0] - 1)
        sampled = jnp.einsum("nd,nsd->ns", q, every_key[pos])
    in_sample = (column < num_sample)[None, :]
    sampled = jax.lax.stop_gradient(sampled)
    sparsity = (jnp.max(jnp.where(in_sample, sampled, -jnp.inf), -1)
                - jnp.sum(jnp.where(in_sample, sampled, 0.0), -1) / num_sample)
    # The top-u queries of the whole sequence, at global positions.
    _, top = _seq.top_k(jnp.where(candidate, sparsity, -jnp.inf), max_top)
    active = (jnp.arange(max_top) < num_top) & _seq.take(candidate, top)
    # Lazy queries: softmax weights taken as uniform, i.e. the mean of the valid values.
    mean = _seq.total(v.sum(0)) / jnp.maximum(n_keys, 1).astype(ct)
    # The active queries' rows, gathered onto every shard, attend over every key.
    logits = _seq.take(q, top) @ k.T  # (max_top, n_k)
    exact = _seq.total(_seq.softmax(logits, k_valid[None, :]) @ v)  # (max_top, d_v)
    out = jnp.broadcast_to(mean, (n, v.shape[-1]))
    # Each shard writes back the active rows it holds.
    out = out.at[_seq.local_index(top, n)].set(
        jnp.where(active[:, None], exact, mean[None, :]), mode="drop")
    return jnp.where(q_valid[:, None], out, 0.0)


@_common.drop_in_signature
def probsparse_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    factor: int = 5,
    rng: Array | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """ProbSparse attention (Informer): exact softmax for the u most active queries, mean elsewhere.

    For each (example, head), with s_ij = scale · q_i·k_j, U = u = clip(c·⌈ln n⌉, 1, n)
    (c = ``factor``, n the number of valid keys for U and of valid queries for u),

        M̄(q_i) = max_{j∈S_i} s_ij − (1/U) Σ_{j∈S_i} s_ij       (S_i: U sampled keys),

    the u queries of largest M̄ get exact attention softmax(s_i·) V over the valid keys and
    every other query gets the mean of the valid values (the output of uniform weights).
    O(n·log n·d) time and memory. The sample S_i is ``rng``-drawn per query, uniformly with
    replacement from the valid keys (Informer's choice), or with ``rng=None`` the same U
    evenly spaced valid keys for every query (deterministic). The selection is not
    differentiable (the gradient reaches the chosen queries, keys and all values). Informer
    divides the sample sum by the full key length; we take the sample mean, as the paper's
    eq. (4) estimates. With c·⌈ln n⌉ ≥ n every valid query is active and the result is
    exact softmax attention.

    Masks: as :func:`nystrom_attention`: a padding mask, reduced to key and query padding;
    padded queries are never selected, padded rows are zero, a query with no valid key gives
    zeros. A key padding mask alone, in self-attention shapes, keeps padded positions out
    of the selection (they get the mean of the values).

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; logits,
        softmax and means in float32).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False: the top-u choice ranks all queries together, so whether an
        early query is active depends on later tokens (Informer's masked decoder form is
        not causal in that sense).
      factor: c, the sampling factor (5 in Informer).
      rng: optional ``jax.random`` key for the key sample (independent per example and
        head, by ``fold_in``); None = evenly spaced, deterministic.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias`` given, ``factor`` not a positive int, or a
        mask that is not a padding mask.
      spectral_jax.UsageTypeError: non-float inputs, ``rng`` not one PRNG key, unknown keywords.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Zhou et al. 2021, "Informer: Beyond Efficient Transformer for Long Sequence
      Time-Series Forecasting", AAAI, §3 eq. (3)-(4) and Lemma 1; code
      zhouhaoyi/Informer2020 ``models/attn.py::ProbAttention``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import probsparse_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> probsparse_attention(q, k, v, factor=5).shape
      (2, 128, 4, 16)
    """
    method = "probsparse_attention"
    # causal_ok: the refusal below says why ProbSparse has no causal form.
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask,
                       causal_ok=True)
    if is_causal:
        raise UnsupportedError(
            f"{method}(): `is_causal=True` is not supported: ProbSparse picks the top-u "
            "queries of the whole sequence, so an earlier query's output depends on later "
            f"tokens. {causal_methods_hint()}"
        )
    _checks.positive_int(f"{method}()", "factor", factor)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(_probsparse_head, scale=p.scale, factor=int(factor))
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid, p.landmark_valid,
        *slice_keys(method, rng, p.query_valid),
        method=method, mask_ok=p.mask_ok, head_chunk_size=head_chunk_size,
    ).astype(query.dtype)
