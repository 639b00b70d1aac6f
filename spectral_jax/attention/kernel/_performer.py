"""Performer (FAVOR+): positive orthogonal random features for the softmax kernel."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _alignment, _common, _seq
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.kernel._linear import feature_attention, lift_feature_head

Array = jax.Array


def orthogonal_random_features(
    rng: Array, num_features: int, head_dim: int, *, scaling: str = "chi",
    dtype: Any = jnp.float32,
) -> Array:
    """Gaussian orthogonal random features ω_1..ω_r for FAVOR+.

    Stacks ⌈r/d⌉ independent d×d blocks, each the orthogonal factor of a QR decomposition
    of a Gaussian matrix, so features inside a block are exactly orthogonal. Rows are then
    rescaled so their norms match Gaussian vectors: ``"chi"`` draws the norms from the χ_d
    distribution (unbiased, the paper's default), ``"sqrt_d"`` sets every norm to √d.

    Args:
      rng: a ``jax.random`` key.
      num_features: r ≥ 1.
      head_dim: d ≥ 1.
      scaling: ``"chi"`` or ``"sqrt_d"``.
      dtype: float dtype of the result.

    Returns:
      ``(num_features, head_dim)`` array of ``dtype``.

    Raises:
      spectral_jax.UsageError: non-positive sizes or unknown ``scaling``.

    References:
      Choromanski et al. 2021, "Rethinking Attention with Performers", ICLR, §2.4 (ORF);
      google-research ``performer/fast_attention/jax/fast_attention.py``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import orthogonal_random_features
      >>> w = orthogonal_random_features(jax.random.key(0), 8, 8, scaling="sqrt_d")
      >>> bool(jnp.allclose(w @ w.T, 8 * jnp.eye(8), atol=1e-4))
      True
    """
    method = "orthogonal_random_features"
    _checks.positive_int(f"{method}()", "num_features", num_features)
    _checks.positive_int(f"{method}()", "head_dim", head_dim)
    _checks.choice(f"{method}()", "scaling", scaling, ("chi", "sqrt_d"))
    if not jnp.issubdtype(dtype, jnp.floating):
        raise UsageTypeError(f"{method}(): `dtype` must be a float dtype; got {dtype!r}.")
    num_blocks = math.ceil(num_features / head_dim)
    block_rng, norm_rng = jax.random.split(rng)
    gaussian = jax.random.normal(block_rng, (num_blocks, head_dim, head_dim), jnp.float32)
    blocks, r = jnp.linalg.qr(gaussian)  # columns orthonormal
    # QR's sign convention ties each column's sign to the Gaussian matrix (Householder makes
    # diag(R) negative), which biases the features; fixing diag(R) > 0 makes each block Haar
    # distributed, so every feature is uniform on the sphere and FAVOR+ unbiased.
    blocks = blocks * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    w = jnp.swapaxes(blocks, -1, -2).reshape(-1, head_dim)[:num_features]
    if scaling == "chi":
        norms = jnp.linalg.norm(jax.random.normal(norm_rng, (num_features, head_dim)), axis=-1)
    else:
        norms = jnp.full((num_features,), math.sqrt(head_dim))
    return (w * norms[:, None]).astype(dtype)


def _performer_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
    segments: Array | None = None, *,
    projection: Array, scale: float, is_causal: bool, eps: float, chunk_size: int,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    root = scale**0.5
    w = projection.astype(ct)

    def logits(rows: Array) -> Array:
        x = rows.astype(ct) * root
        return x @ w.T - 0.5 * jnp.sum(x * x, -1, keepdims=True)

    # Stabilisers cancel between numerator and denominator (up to eps): per query row, and
    # one for all valid keys of this (batch, head), so padding never sets the scale.
    k_max = _seq.maximum(
        _valid_max(logits, jax.lax.stop_gradient(k), k_valid, chunk_size if is_causal else None))
    k_stab = jax.lax.stop_gradient(jnp.where(jnp.isfinite(k_max), k_max, 0.0))
    # In the causal form eps would make early outputs depend on later keys through the
    # shared key stabiliser, so it is dropped there (the scan's own eps guards 0/0).
    feat_eps = 0.0 if is_causal else eps
    inv_sqrt_r = 1.0 / math.sqrt(w.shape[0])

    def query_features(rows: Array) -> Array:
        q_logits = logits(rows)
        q_stab = jax.lax.stop_gradient(q_logits.max(-1, keepdims=True))
        return (jnp.exp(q_logits - q_stab) + feat_eps) * inv_sqrt_r

    def key_features(rows: Array, valid: Array) -> Array:
        k_logits = jnp.where(valid[:, None], logits(rows), k_stab)
        return jnp.where(valid[:, None], (jnp.exp(k_logits - k_stab) + feat_eps) * inv_sqrt_r, 0.0)

    v = jnp.where(k_valid[:, None], v.astype(ct), 0.0)
    out = feature_attention(query_features, key_features, q, k, v, k_valid,
                            is_causal=is_causal, chunk_size=chunk_size, eps=0.0,
                            segments=segments)
    # A query with no valid key: numerator and denominator are both 0.
    return jnp.where(q_valid[:, None] & (_seq.total(k_valid.sum()) > 0), out, 0.0)


def _valid_max(
    logits: Callable[[Array], Array], k: Array, k_valid: Array, chunk_size: int | None
) -> Array:
    """max of ``logits(k)`` over valid keys (-inf if none); chunk by chunk when given a size,
    so that the causal form never holds the (n, r) logits at once."""
    def chunk_max(rows: Array, valid: Array) -> Array:
        return jnp.max(jnp.where(valid[:, None], logits(rows), -jnp.inf))

    n = k.shape[0]
    if chunk_size is None or chunk_size >= n:
        return chunk_max(k, k_valid)
    pad = (-n) % chunk_size
    rows = jnp.pad(k, ((0, pad), (0, 0))).reshape(-1, chunk_size, k.shape[-1])
    valid = jnp.pad(k_valid, (0, pad)).reshape(-1, chunk_size)
    return jax.lax.map(lambda chunk: chunk_max(*chunk), (rows, valid)).max()


@_common.drop_in_signature
def performer_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    projection: Array | None = None,
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
    """Performer (FAVOR+) attention with positive random features, unbiased for softmax.

    φ(x) = (exp(Wx̂ − ‖x̂‖²/2 − s) + eps)/√r with x̂ = x·scale^{1/2}, so E[φ(q)ᵀφ(k)] ∝
    exp(q·k·scale); out = φ(Q)(φ(K)ᵀV) / φ(Q)φ(K)ᵀ1. Stabilisers s: per query row, and per
    (batch, head) over valid keys. The projection W is an explicit argument (draw it with
    :func:`orthogonal_random_features`); nothing is seeded from data, and the Flax module
    stores and redraws it. Padded keys are removed; a query with no valid key gives zeros.
    ``is_causal=True`` uses the chunked prefix-sum scan of :func:`feature_attention`.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)``.
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: causal form (eps is then not added to the features).
      causal_alignment: ``"top_left"`` (query i sees keys j ≤ i, as ``jax.nn``) or
        ``"bottom_right"`` (keys j ≤ kv_len − q_len + i): Flax's
        ``MultiHeadAttention(decode=True)`` decodes the causal form with ``is_causal=True,
        causal_alignment="bottom_right"`` (Flax passes its own ``is_causal``, default False:
        the step is then the bidirectional form over the cache, which adds eps).
      projection: float ``(num_features, head_dim)``, required.
      eps: feature stabiliser (1e-6 as in the JAX reference).
      chunk_size: tokens per chunk of the causal scan.
      segment_ids: optional int ``(batch..., length)`` of packed sequences (self-attention,
        each id one contiguous run): the running sums restart at each new id
        (:mod:`spectral_jax.attention.core._segments`).
      query_segment_ids, kv_segment_ids: accepted when equal (this form is self-attention).

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias``, missing projection or one whose last dim is not
        head_dim, an unknown ``causal_alignment``, non-padding mask.

    References:
      Choromanski et al. 2021, "Rethinking Attention with Performers", ICLR, Lemma 1 and
      §2.4 (FAVOR+); google-research ``performer/fast_attention/jax/fast_attention.py``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import performer_attention, orthogonal_random_features
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> w = orthogonal_random_features(jax.random.key(1), 64, 16)
      >>> performer_attention(q, k, v, projection=w).shape
      (2, 128, 4, 16)
    """
    method = "performer_attention"
    value, unfold = _common.fold_grouped_values(method, query, key, value)
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs,
                       mask=mask, causal_ok=True)
    _checks.positive_int(f"{method}()", "chunk_size", chunk_size)
    if projection is None or getattr(projection, "ndim", 0) != 2:
        raise UsageError(
            f"{method}(): `projection` must be a (num_features, head_dim) array, e.g. from "
            "orthogonal_random_features(rng, 256, head_dim); got "
            f"{getattr(projection, 'shape', projection)!r}."
        )
    if projection.shape[-1] != query.shape[-1]:
        raise UsageError(
            f"{method}(): `projection` has {projection.shape[-1]} columns but head_dim is "
            f"{query.shape[-1]}; it must be (num_features, head_dim)."
        )
    bottom_right = _alignment.bottom_right(method, causal_alignment)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=is_causal, bottom_right=bottom_right)
    head = functools.partial(
        _performer_head, projection=projection, scale=p.scale, is_causal=is_causal,
        eps=_checks.number(f"{method}()", "eps", eps, low=0.0, what="a finite float >= 0"),
        chunk_size=chunk_size,
    )
    return unfold(lift_feature_head(method, head, query, key, value, p,
                             (segment_ids, query_segment_ids, kv_segment_ids),
                             is_causal=is_causal, bottom_right=bottom_right,
                             head_chunk_size=head_chunk_size))
