"""Linear attention with positive feature maps (Katharopoulos et al. 2020), both directions
and causal."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _alignment, _common, _segments, _seq
from spectral_jax.attention.core._prologue import prologue

Array = jax.Array

FEATURE_MAPS = {
    "elu": lambda x: jax.nn.elu(x) + 1.0,
    "relu": jax.nn.relu,
}


def _positive(den: Array) -> Array:
    # A query with no valid key has 0/0; replacing the zero keeps values and gradients finite.
    return jnp.where(den > 0, den, 1.0)


def feature_attention(
    query_features: Callable[[Array], Array],
    key_features: Callable[[Array, Array], Array],
    q: Array, k: Array, v: Array, k_valid: Array, *,
    is_causal: bool, chunk_size: int, eps: float, segments: Array | None = None,
) -> Array:
    """φ(Q)(φ(K)ᵀV) / (φ(Q)φ(K)ᵀ1 + eps) for one head, from feature maps applied to rows.

    ``query_features(q_rows)`` and ``key_features(k_rows, k_valid_rows)`` map any block of
    rows to non-negative ``(rows, r)`` features (zero for padded keys). The bidirectional
    form applies them to all n rows at once: O(n·r) memory, as the two matrix products need.

    The causal form runs a ``lax.scan`` over chunks of ``chunk_size`` tokens: inside a chunk
    it uses the (chunk × chunk) lower-triangular product, across chunks it carries the
    prefix sums Σφ(k)vᵀ (r × d_v) and Σφ(k) (r). Each step computes its own chunk's
    features and is rematerialised in the backward pass, so neither the (n, r) features nor
    their gradients are ever held whole: beyond O(n·d) copies of the inputs and their
    gradients, the backward pass keeps one carry per chunk, O((n/chunk)·r·d_v), and one
    step's O(chunk·(r + chunk + d_v)) work (compiled sizes in
    ``benchmarks/attention_cpu_measurements.md``).

    With ``segments`` (int ``(n,)``, self-attention, each id one contiguous run) the sums
    restart where the id changes (:func:`segmented_sums`).

    Args:
      query_features: ``(rows, d) -> (rows, r)``.
      key_features: ``((rows, d), bool (rows,)) -> (rows, r)``.
      q: ``(n, d)``; k ``(n_k, d)``; v ``(n_k, d_v)`` with padded rows zeroed; k_valid
        bool ``(n_k,)``.

    Returns:
      ``(n, d_v)`` in the features' dtype.
    """
    if segments is not None:
        num, den = segmented_sums(query_features, key_features, q, k, v, k_valid, segments,
                                  chunk_size=chunk_size, strict=False)
        if not is_causal:  # the keys after each query, in the reversed row (and shards)
            flip = lambda x: x[::-1]  # noqa: E731
            after = segmented_sums(query_features, key_features, *map(flip, (q, k, v, k_valid,
                                   segments)), chunk_size=chunk_size, strict=True,
                                   reverse=True)
            num, den = num + after[0][::-1], den + after[1][::-1]
        return num / _positive(den + eps)[:, None]
    if not is_causal:
        phi_q, phi_k = query_features(q), key_features(k, k_valid)
        # On a sequence split over devices: one all-reduce of the (r, d_v + 1) key summary.
        kv, k_sum = _seq.total((phi_k.T @ v, phi_k.sum(0)))
        return (phi_q @ kv) / _positive(phi_q @ k_sum + eps)[:, None]
    n = q.shape[0]
    c = min(chunk_size, n)
    pad = (-n) % c
    nc = (n + pad) // c
    # Rows past n are padding keys (masked) and queries whose outputs are cut off; a key
    # there only reaches later queries, so it never touches a kept output.
    chunks = [jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)).reshape(nc, c, *x.shape[1:])
              for x in (q, k, v, k_valid)]

    def step(carry, chunk):
        state, norm = carry
        cq, ck, cv, ck_valid = chunk
        fq, fk = query_features(cq), key_features(ck, ck_valid)
        local = jnp.tril(fq @ fk.T)
        num = fq @ state + local @ cv
        den = fq @ norm + local.sum(-1)
        return (state + fk.T @ cv, norm + fk.sum(0)), num / _positive(den + eps)[:, None]

    r = jax.eval_shape(query_features, chunks[0][0]).shape[-1]
    ct = jnp.result_type(jax.eval_shape(query_features, chunks[0][0]).dtype, v.dtype)
    init = (jnp.zeros((r, v.shape[-1]), ct), jnp.zeros((r,), ct))
    if _seq.active() is not None:
        # A split sequence (LASP-2): each shard starts from the states of the shards
        # before it, an exclusive prefix of every shard's own (r, d_v + 1) totals.
        def add_chunk(carry, chunk):
            _, ck, cv, ck_valid = chunk
            fk = key_features(ck, ck_valid)
            return (carry[0] + fk.T @ cv, carry[1] + fk.sum(0)), None

        # The scan's carry must vary over the mesh axes as the shard's data do.
        zero = jnp.zeros_like(k_valid[0], dtype=ct)
        totals, _ = jax.lax.scan(jax.checkpoint(add_chunk, prevent_cse=False),
                                 jax.tree.map(lambda x: x + zero, init), chunks)
        init = _seq.exclusive_prefix(totals)
    _, out = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), init, chunks)
    return out.reshape(nc * c, -1)[:n]


def segmented_sums(
    query_features: Callable[[Array], Array],
    key_features: Callable[[Array, Array], Array],
    q: Array, k: Array, v: Array, k_valid: Array, segments: Array, *,
    chunk_size: int, strict: bool, reverse: bool = False,
) -> tuple[Array, Array]:
    """Numerator ``(n, d_v)`` and denominator ``(n,)`` of causal feature attention inside
    segments: query i sums keys j ≤ i (j < i if ``strict``) of its own contiguous run.

    The chunked scan of :func:`feature_attention` with the carried sums tagged by the id of
    the run they belong to: a query reads them only if it has that id, and a chunk's new
    sums keep the carried ones only if its last token continues the run. On a split
    sequence each shard starts from the sums of the run that enters it from the shards
    before it (after it, with ``reverse``: the rows are reversed), :func:`_entering_run`.
    """
    n = q.shape[0]
    c = min(chunk_size, n)
    pad = (-n) % c
    nc = (n + pad) // c
    chunks = [jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)).reshape(nc, c, *x.shape[1:])
              for x in (q, k, v, k_valid, segments)]
    lower = jnp.tril(jnp.ones((c, c), bool), k=-1 if strict else 0)

    def step(carry, chunk):
        state, norm, run = carry
        cq, ck, cv, ck_valid, cs = chunk
        fq, fk = query_features(cq), key_features(ck, ck_valid)
        local = jnp.where(lower & (cs[:, None] == cs[None, :]), fq @ fk.T, 0.0)
        reads = (cs == run)[:, None]
        num = jnp.where(reads, fq @ state, 0.0) + local @ cv
        den = jnp.where(reads[:, 0], fq @ norm, 0.0) + local.sum(-1)
        last = cs[-1]
        fk_last = jnp.where((cs == last)[:, None], fk, 0.0)
        kept = run == last
        state = jnp.where(kept, state, 0.0) + fk_last.T @ cv
        norm = jnp.where(kept, norm, 0.0) + fk_last.sum(0)
        return (state, norm, last), (num, den)

    features = jax.eval_shape(query_features, chunks[0][0])
    ct = jnp.result_type(features.dtype, v.dtype)
    init = (jnp.zeros((features.shape[-1], v.shape[-1]), ct),
            jnp.zeros((features.shape[-1],), ct), segments[0])
    scan = functools.partial(jax.lax.scan, jax.checkpoint(step, prevent_cse=False))
    if _seq.active() is not None:
        zero = jnp.zeros_like(k_valid[0], dtype=ct)  # the carry varies over the mesh axes
        init = jax.tree.map(lambda x: x + zero.astype(x.dtype), init)
        leaving, _ = scan(init, chunks)
        init = _entering_run(leaving, segments[0], reverse=reverse)
    _, (num, den) = scan(init, chunks)
    return num.reshape(nc * c, -1)[:n], den.reshape(-1)[:n]


def _entering_run(leaving: tuple[Array, Array, Array], first: Array, *,
                  reverse: bool) -> tuple[Array, Array, Array]:
    """The carry ``(state, norm, id)`` entering this shard: the sums, over the shards before
    it (after it, ``reverse``), of the run its predecessor ends with. Shard t leaves the sums
    of its last run, plus what entered it when it is that one run throughout; one
    all-gather of every shard's ``(r·d_v + r + 2)`` numbers, whatever the length."""
    shard = _seq.active()
    state, norm, last = leaving
    whole = first == last  # one run throughout (ids are runs): it passes the carry on
    every = [jax.lax.all_gather(x, shard.axis_name) for x in (state, norm, first, last, whole)]
    index = jax.lax.axis_index(shard.axis_name)
    carry = (jnp.zeros_like(state), jnp.zeros_like(norm), first)
    for t in (range(shard.num_shards - 1, -1, -1) if reverse else range(shard.num_shards)):
        s_t, n_t, first_t, last_t, whole_t = (x[t] for x in every)
        joins = whole_t & (carry[2] == first_t)
        new = (s_t + jnp.where(joins, carry[0], 0.0), n_t + jnp.where(joins, carry[1], 0.0),
               last_t)
        before = t > index if reverse else t < index
        carry = tuple(jnp.where(before, a, b) for a, b in zip(new, carry))
    return carry


def _linear_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
    segments: Array | None = None, *,
    feature_map: str, is_causal: bool, chunk_size: int, eps: float,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    phi = FEATURE_MAPS[feature_map]
    v = jnp.where(k_valid[:, None], v.astype(ct), 0.0)
    out = feature_attention(
        lambda rows: phi(rows.astype(ct)),
        lambda rows, valid: jnp.where(valid[:, None], phi(rows.astype(ct)), 0.0),
        q, k, v, k_valid, is_causal=is_causal, chunk_size=chunk_size, eps=eps,
        segments=segments)
    return jnp.where(q_valid[:, None], out, 0.0)


@_common.drop_in_signature
def linear_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    feature_map: str = "elu",
    eps: float = 1e-6,
    chunk_size: int = 128,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    segment_ids: Array | None = None,
    query_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Linear attention: y_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps), φ = elu + 1.

    O(n·d·d_v) time. There is no 1/sqrt(d) logit scale in this method, so ``scale`` must be
    None. Padded keys are removed by zeroing their features; padded queries give zero rows;
    a query with no valid key gives 0/(0 + eps) = 0. With ``is_causal=True`` key j only
    reaches queries i ≥ j, by a chunked scan (see :func:`feature_attention`); with q_len ≠
    kv_len, ``causal_alignment`` places the queries (:mod:`spectral_jax.attention.core._alignment`:
    top-left as in jax.nn, or bottom-right as one decoding query against a cache).

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``.
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: must be None (the feature map replaces the softmax scale).
      is_causal: causal (autoregressive) form.
      causal_alignment: ``"top_left"`` (query i sees keys j ≤ i, as ``jax.nn``) or
        ``"bottom_right"`` (keys j ≤ kv_len − q_len + i, as in decoding).
      feature_map: ``"elu"`` (elu(x) + 1, the paper's) or ``"relu"``.
      eps: added to the normaliser (1e-6 as in fast-transformers).
      chunk_size: tokens per chunk of the causal scan.
      segment_ids: optional int ``(batch..., length)`` of packed sequences (self-attention,
        each id one contiguous run): the running sums restart at each new id
        (:mod:`spectral_jax.attention.core._segments`).
      query_segment_ids, kv_segment_ids: accepted when equal (this form is self-attention).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype (float32 sums inside).

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias``, ``scale`` given, unknown ``feature_map``,
        non-positive ``chunk_size``, an unknown ``causal_alignment``, non-padding mask.

    References:
      Katharopoulos et al. 2020, "Transformers are RNNs", ICML, eq. (6)-(9); code
      idiap/fast-transformers ``LinearAttention``, ``CausalLinearAttention``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import linear_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> linear_attention(q, k, v, is_causal=True).shape
      (2, 128, 4, 16)
    """
    method = "linear_attention"
    value, unfold = _common.fold_grouped_values(method, query, key, value)
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs,
                       mask=mask, causal_ok=True)
    _checks.choice(f"{method}()", "feature_map", feature_map, tuple(FEATURE_MAPS))
    _checks.positive_int(f"{method}()", "chunk_size", chunk_size)
    if scale is not None:
        raise UsageError(
            f"{method}(): `scale` must be None: linear attention has no logit scale; got {scale!r}."
        )
    bottom_right = _alignment.bottom_right(method, causal_alignment)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=is_causal, bottom_right=bottom_right)
    head = functools.partial(
        _linear_head, feature_map=feature_map, is_causal=is_causal, chunk_size=chunk_size,
        eps=_checks.number(f"{method}()", "eps", eps, low=0.0, what="a finite float >= 0"),
    )
    return unfold(lift_feature_head(method, head, query, key, value, p,
                             (segment_ids, query_segment_ids, kv_segment_ids),
                             is_causal=is_causal, bottom_right=bottom_right,
                             head_chunk_size=head_chunk_size))


def lift_feature_head(method: str, head: Callable[..., Array], query: Array, key: Array,
                      value: Array, p: Any, segment_args: tuple[Any, Any, Any], *,
                      is_causal: bool, bottom_right: bool,
                      head_chunk_size: int | None) -> Array:
    """A feature-map head over batch and heads (:func:`_alignment.aligned_lift`), with the
    segment ids its running sums restart at; in ``query``'s dtype."""
    segments, mask_ok = _segments.for_running_state(method, query, key, segment_args,
                                                    p.mask_ok)
    return _alignment.aligned_lift(
        head, query, key, value, p.query_valid, p.key_valid, *segments, is_causal=is_causal,
        bottom_right_aligned=bottom_right,
        method=method, head_chunk_size=head_chunk_size, mask_ok=mask_ok,
    ).astype(query.dtype)
