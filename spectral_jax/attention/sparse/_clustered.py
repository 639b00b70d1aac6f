"""Clustered attention (Vyas et al. 2020): k-means query clusters share their centroid's output."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._landmarks import evenly_spaced_positions, random_positions
from spectral_jax.attention.core._prologue import prologue, slice_keys

Array = jax.Array


def kmeans_queries(
    q: Array, member: Array, num_clusters: int, iterations: int, rng: Array | None = None
) -> tuple[Array, Array]:
    """Lloyd's k-means on the member queries of one head; every query gets its nearest centroid.

    Start: ``num_clusters`` member queries evenly spaced over the members in order
    (``rng=None``, deterministic), or drawn uniformly with replacement from the members
    (``rng`` given; a repeated draw leaves a cluster empty). Only members move the
    centroids; an empty cluster keeps its previous centroid. The loop runs under
    ``stop_gradient``: the returned centroids are the means of the final clusters, so the
    gradient reaches each member query through its centroid, as in the reference code.

    Args:
      q: float ``(n, d)`` (padded rows already zeroed).
      member: bool ``(n,)``, the queries that define the clusters.
      num_clusters: C.
      iterations: Lloyd steps after the start.
      rng: optional ``jax.random`` key for the start.

    Returns:
      ``(centroids (C, d), assignment int32 (n,))``; a cluster with no member has a zero
      centroid, and no member query is assigned to it.
    """
    if rng is None:
        start = evenly_spaced_positions(member, num_clusters)
    else:
        start = random_positions(rng, member, num_clusters)
    q_fixed = jax.lax.stop_gradient(q)
    weights = member.astype(q.dtype)

    def assign(centroids: Array) -> Array:
        # ||q - c||² less the per-query constant ||q||²: O(n·C·d), no (n, C, d) array.
        dist = jnp.sum(centroids * centroids, -1)[None, :] - 2.0 * q_fixed @ centroids.T
        return jnp.argmin(dist, axis=-1).astype(jnp.int32)

    def means(x: Array, assignment: Array) -> tuple[Array, Array]:
        sums = jax.ops.segment_sum(x * weights[:, None], assignment, num_segments=num_clusters)
        counts = jax.ops.segment_sum(weights, assignment, num_segments=num_clusters)
        # On a sequence split over devices: C sums and C counts per shard, one all-reduce.
        sums, counts = _seq.total((sums, counts))
        return sums / jnp.maximum(counts, 1.0)[:, None], counts

    def lloyd(_: int, centroids: Array) -> Array:
        new, counts = means(q_fixed, assign(centroids))
        return jnp.where(counts[:, None] > 0, new, centroids)

    # The start positions are global: every shard gets the same C queries.
    centroids = jax.lax.fori_loop(0, iterations, lloyd, _seq.take(q_fixed, start))
    assignment = assign(centroids)
    centroids, _ = means(q, assignment)
    return centroids, assignment


def _cluster_logits(
    q: Array, k: Array, q_valid: Array, member: Array, rng: Array | None, *,
    scale: Any, num_clusters: int, iterations: int,
) -> tuple[Array, Array, Array, Array]:
    ct = _common.compute_dtype(q.dtype)
    q = jnp.where(q_valid[:, None], q.astype(ct), 0.0)
    centroids, assignment = kmeans_queries(q, member & q_valid, num_clusters, iterations, rng)
    return q, centroids, assignment, (centroids * scale) @ k.T


def _clustered_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, member: Array,
    rng: Array | None = None, *, scale: Any, num_clusters: int, iterations: int,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    _, _, assignment, logits = _cluster_logits(
        q, k, q_valid, member, rng, scale=scale, num_clusters=num_clusters,
        iterations=iterations)
    # A softmax over every key and the weighted sum of values, both reduced over the shards.
    cluster_out = _seq.total(_seq.softmax(logits, k_valid[None, :]) @ v.astype(ct))  # (C, d_v)
    return jnp.where(q_valid[:, None], cluster_out[assignment], 0.0)


def _improved_clustered_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, member: Array,
    rng: Array | None = None, *, scale: Any, num_clusters: int, iterations: int, topk: int,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    k = jnp.where(k_valid[:, None], k.astype(ct), 0.0)
    v = v.astype(ct)
    topk = min(topk, _seq.global_length(k.shape[0]))
    q, _, assignment, logits = _cluster_logits(
        q, k, q_valid, member, rng, scale=scale, num_clusters=num_clusters,
        iterations=iterations)
    centroid_weights = _seq.softmax(logits, k_valid[None, :])  # (C, n_k)
    # The top-k keys of each centroid, at global positions; an index past the valid keys
    # (fewer than k of them) points at padding and is masked below.
    _, top = _seq.top_k(jnp.where(k_valid[None, :], logits, -jnp.inf), topk)  # (C, k)
    top_valid = _seq.take(k_valid, top)
    # Each shard marks the top keys it holds.
    in_top = jnp.zeros(centroid_weights.shape, bool).at[
        jnp.arange(num_clusters)[:, None], _seq.local_index(top, k.shape[0])].set(
        top_valid, mode="drop")
    rest = jnp.where(in_top, 0.0, centroid_weights)
    rest_mass, rest_out = _seq.total((rest.sum(-1), rest @ v))  # (C,), (C, d_v)
    top_mass = 1.0 - rest_mass  # m̂_c: the centroid's mass on its top-k keys
    # Each query recomputes exact weights on its cluster's top-k keys: O(n·k·d); the C·k
    # top keys and values are gathered onto every shard.
    q_logits = jnp.einsum("nd,nkd->nk", q * scale, _seq.take_selected(k, top, assignment))
    q_weights = _common.masked_softmax(q_logits, top_valid[assignment])
    exact = jnp.einsum("nk,nkd->nd", q_weights, _seq.take_selected(v, top, assignment))
    out = top_mass[assignment][:, None] * exact + rest_out[assignment]
    return jnp.where(q_valid[:, None], out, 0.0)


def _run(
    method: str, head: Any, query: Array, key: Array, value: Array, bias: Array | None,
    mask: Array | None, scale: Any, is_causal: bool, num_clusters: Any, iterations: Any,
    rng: Array | None, query_seq_lengths: Array | None, key_value_seq_lengths: Array | None,
    head_chunk_size: int | None, flax_kwargs: dict[str, Any],
) -> Array:
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    _checks.positive_int(f"{method}()", "num_clusters", num_clusters)
    _checks.nonnegative_int(f"{method}()", "iterations", iterations)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(head, scale=p.scale, num_clusters=int(num_clusters),
                             iterations=int(iterations))
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid, p.landmark_valid,
        *slice_keys(method, rng, p.query_valid),
        method=method, mask_ok=p.mask_ok, head_chunk_size=head_chunk_size,
    ).astype(query.dtype)


@_common.drop_in_signature
def clustered_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    num_clusters: int = 100,
    iterations: int = 10,
    rng: Array | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Clustered attention: each query gets the exact attention output of its cluster's centroid.

    The valid queries of each (example, head) are grouped into C clusters by
    :func:`kmeans_queries`; with centroids Q_c (member means),

        V'_c = softmax(scale · Q_c Kᵀ) V,     out_i = V'_{c(i)},

    with the softmax over the valid keys only. O(n·C·d) time and memory. The paper clusters
    Hamming codes of random-hyperplane hashes of the queries; we run k-means on the queries
    themselves (the distance the hashing approximates), from a deterministic start
    (``rng=None``: evenly spaced valid queries) or a random one (``rng``). With C at least
    the number of valid queries and ``rng=None`` every query is its own centroid and the
    result is exact softmax attention. The assignment is not differentiable; the gradient
    reaches the queries through the centroid means.

    Masks: as :func:`nystrom_attention`: a padding mask, reduced to key and query padding;
    padded queries never move a centroid, padded rows are zero, a query with no valid key
    gives zeros. A key padding mask alone, in self-attention shapes, also keeps padded
    positions out of the centroids (they are still assigned and get an output).

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; distances,
        softmax and means in float32).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False (a centroid mixes queries from all positions).
      num_clusters: C, the number of query clusters (the paper uses 100-200); more than the
        valid queries is allowed (the extra clusters stay empty).
      iterations: Lloyd steps (10 in the reference code); 0 keeps the start.
      rng: optional ``jax.random`` key for the k-means start (one independent start per
        example and head, by ``fold_in``); None = evenly spaced, deterministic.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias`` given, ``num_clusters`` not a positive int,
        ``iterations`` not a non-negative int, or a mask that is not a padding mask.
      spectral_jax.UsageTypeError: non-float inputs, ``rng`` not one PRNG key, unknown keywords.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Vyas, Katharopoulos & Fleuret 2020, "Fast Transformers with Clustered Attention",
      NeurIPS, §3.2 eq. (6)-(7); code idiap/fast-transformers ``ClusteredAttention``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import clustered_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> clustered_attention(q, k, v, num_clusters=16).shape
      (2, 128, 4, 16)
    """
    return _run("clustered_attention", _clustered_head, query, key, value, bias, mask, scale,
                is_causal, num_clusters, iterations, rng, query_seq_lengths,
                key_value_seq_lengths, head_chunk_size, flax_kwargs)


@_common.drop_in_signature
def improved_clustered_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    num_clusters: int = 100,
    iterations: int = 10,
    topk: int = 32,
    rng: Array | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Improved clustered attention: exact per-query weights on each centroid's top-k keys.

    Queries are clustered as in :func:`clustered_attention`. For cluster c with centroid
    weights A^c = softmax(scale · Q_c Kᵀ) and T_c its ``topk`` keys of largest centroid
    logit, m̂_c = Σ_{j∈T_c} A^c_j, and query i of cluster c gets

        A_ij = m̂_c · exp(scale q_i·k_j) / Σ_{r∈T_c} exp(scale q_i·k_r)   for j ∈ T_c,
        A_ij = A^c_j                                                      otherwise,

    so each row still sums to 1 and the top keys share the centroid's mass on them, but in
    the query's own proportions. O(n·(C + k)·d). With ``topk`` at least the number of valid
    keys every key is in T_c, m̂_c = 1 and the result is exact softmax attention whatever
    the clusters.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; distances,
        softmax and means in float32).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False (a centroid mixes queries from all positions).
      num_clusters: C, the number of query clusters (the paper uses 100-200); more than the
        valid queries is allowed (the extra clusters stay empty).
      iterations: Lloyd steps (10 in the reference code); 0 keeps the start.
      topk: k, the keys per cluster recomputed per query (32 in the reference code); it
        is capped at kv_len.
      rng: optional ``jax.random`` key for the k-means start; None = evenly spaced.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: as :func:`clustered_attention`, and ``topk`` not a positive int.
      spectral_jax.UsageTypeError: non-float inputs, ``rng`` not one PRNG key, unknown keywords.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).

    References:
      Vyas, Katharopoulos & Fleuret 2020, "Fast Transformers with Clustered Attention",
      NeurIPS, §3.3 eq. (9)-(10); code idiap/fast-transformers
      ``ImprovedClusteredAttention``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import improved_clustered_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> improved_clustered_attention(q, k, v, num_clusters=16, topk=8).shape
      (2, 128, 4, 16)
    """
    method = "improved_clustered_attention"
    _checks.positive_int(f"{method}()", "topk", topk)
    head = functools.partial(_improved_clustered_head, topk=int(topk))
    return _run(method, head, query, key, value, bias, mask, scale, is_causal, num_clusters,
                iterations, rng, query_seq_lengths, key_value_seq_lengths, head_chunk_size,
                flax_kwargs)
