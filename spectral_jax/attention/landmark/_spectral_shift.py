"""Spectral shifting ("Beyond Nyströmformer"): Nyström plus δ·I, δ from the residual's trace."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._landmarks import (
    evenly_spaced_positions,
    position_of_rank,
    segment_means,
)
from spectral_jax.attention.core._prologue import Prologue, prologue
from spectral_jax.attention.exact import _softmax
from spectral_jax.attention.landmark._nystrom import (
    LandmarkKernels,
    check_landmark_args,
    global_pinv_norm,
    landmark_kernels,
    landmark_values,
)
from spectral_jax.attention.landmark._pinv import iterative_pinv

Array = jax.Array

SHIFTS = ("paired", "split", "exact", "zero")
# The paired form's default sample: half the landmarks, and at least this many rows. Measured
# by benchmarks/spectral_shift_delta_forms.py (n = 1024): at m = 64 it costs 1.15x
# Nyströmformer's operations, forward and backward, against 1.27x with s = m; fewer rows at
# m = 16 (s = 8 or 12) left the sharpness-1.0 error outside the split form's seed range.
MIN_PAIRED_ROWS = 32


def delta_rows(shift: str, num_delta_rows: int | None, num_landmarks: int) -> int:
    """The number s of sampled diagonal rows: ``num_delta_rows``, else the form's default.

    ``"paired"``: max(32, m // 2); ``"split"``: m.
    """
    if num_delta_rows is not None:
        return num_delta_rows
    if shift == "paired":
        return max(MIN_PAIRED_ROWS, num_landmarks // 2)
    return num_landmarks


def _sampled_rows(diag_valid: Array, shift: str, num_rows: int) -> tuple[Array, Array]:
    """The diagonal rows δ is taken from, and which of them count.

    ``"exact"``: every row. ``"split"``: ``num_rows`` positions evenly spaced over the valid
    tokens (repeated when there are fewer valid tokens than that). ``"paired"``: the same
    positions, but each valid token once when there are at most ``num_rows`` of them, so
    that the sample is then the whole diagonal. Rows are chosen by rank among the valid
    tokens, never by padded position, so padding never changes which tokens are sampled.
    Positions are global on a sequence split over devices.
    """
    n = _seq.global_length(diag_valid.shape[0])
    if shift == "exact" or (shift == "paired" and num_rows >= n):
        rows = jnp.arange(n)
        return rows, _seq.take(diag_valid, rows)
    if shift == "split":
        rows = evenly_spaced_positions(diag_valid, num_rows)
        return rows, _seq.take(diag_valid, rows)
    n_valid = _seq.total(diag_valid.sum())
    j = jnp.arange(num_rows)
    ranks = jnp.where(n_valid <= num_rows, j, ((2 * j + 1) * n_valid) // (2 * num_rows))
    rows = position_of_rank(diag_valid, jnp.minimum(ranks, jnp.maximum(n_valid - 1, 0)))
    return rows, (j < n_valid) & _seq.take(diag_valid, rows)


def _split_trace_terms(
    kern: LandmarkKernels, z: Array, v: Array, diag: Array, diag_valid: Array,
    row_valid: Array,
) -> tuple[Array, Array, Array]:
    """``shift="split"``: tr S − tr(F Z B), n_valid − tr(F Z B), and BV.

    tr S is n_valid times the mean of the sampled S_ii (a stratified sample, O(s·n·d));
    tr(F Z B) = tr(Z (B F)) is exact over all n rows, O(n·m²), never the n x n matrix. B·[V, F]
    is one product, giving BV for the output too.
    """
    f_diag = jnp.where(diag_valid[:, None], kern.f, 0.0)
    d = v.shape[-1]
    bv_bf = _seq.total(kern.b @ jnp.concatenate([v, f_diag], axis=-1))
    trace_nystrom = jnp.sum(z * bv_bf[:, d:].T)
    n_valid = _seq.total(diag_valid.sum())
    trace_s = n_valid * jnp.mean(jnp.where(row_valid, diag, 0.0))
    return trace_s - trace_nystrom, n_valid - trace_nystrom, bv_bf[:, :d]


def _paired_trace_terms(
    kern: LandmarkKernels, z: Array, rows: Array, f_rows: Array, diag: Array,
    row_valid: Array,
) -> tuple[Array, Array]:
    """Σ_i (S_ii − N_ii) and Σ_i (1 − N_ii) over the sampled rows i, N_ii = F_i Z B_{:,i}.

    O(s·m²): both sums come from the same rows, so their sampling errors largely cancel in
    the ratio δ, and it is exact whenever both diagonals are constant (or every valid row is
    sampled). ``f_rows`` is F at ``rows``.
    """
    nystrom_diag = jnp.sum((f_rows @ z) * _seq.take(kern.b, rows, 1).T, axis=-1)
    residual = jnp.sum(jnp.where(row_valid, diag - nystrom_diag, 0.0))
    room = jnp.sum(jnp.where(row_valid, 1.0 - nystrom_diag, 0.0))
    return residual, room


def _shifted_kernels(
    q: Array, k: Array, q_valid: Array, k_valid: Array, rows: Array, num_landmarks: int
) -> tuple[LandmarkKernels, Array, Array]:
    """F, A, B as :func:`landmark_kernels`, S_ii at ``rows`` from the same pass over K, and
    F's rows at ``rows``.

    The sampled query rows are stacked under the query landmarks, so one matmul and one
    masked softmax over the keys give both B and the sampled rows of S (forward and
    backward): S_ii is then read off the normalised row rather than from a separate
    logsumexp. F's sampled rows are recomputed from the gathered query rows (s x m), not
    gathered from F, whose gather would cost an n x m scatter in the backward pass.
    """
    m = num_landmarks
    q_lm, q_lm_valid = segment_means(q, q_valid, m)
    k_lm, k_lm_valid = segment_means(k, k_valid, m)
    f_logits = q @ k_lm.T
    f = _common.masked_softmax(f_logits, k_lm_valid[None, :])
    a = _common.masked_softmax(q_lm @ k_lm.T, k_lm_valid[None, :]) * q_lm_valid[:, None]
    q_rows = _seq.take(q, rows)
    f_rows = _common.masked_softmax(q_rows @ k_lm.T, k_lm_valid[None, :])
    rows_b = _seq.softmax(jnp.concatenate([q_lm, q_rows]) @ k.T, k_valid[None, :])
    b = rows_b[:m] * q_lm_valid[:, None]
    # A padded key's S_ii is zero here (the softmax gives masked entries zero weight).
    diag = _seq.take_entries(rows_b[m:], rows)
    return LandmarkKernels(f, a, b, k_lm_valid, k_lm, f_logits), diag, f_rows


def _shift_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, q_landmark_valid: Array, *,
    scale: float, num_landmarks: int, pinv_iterations: int | None, pinv_init: str,
    shift: str, num_delta_rows: int | None, return_delta: bool,
    pinv_scale: Array | None = None,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    q, k, v = q.astype(ct) * scale, k.astype(ct), v.astype(ct)
    if shift == "zero":
        kern = landmark_kernels(q, k, q_landmark_valid, k_valid, num_landmarks)
        z = iterative_pinv(kern.a, pinv_iterations, pinv_init, norm=pinv_scale)
        out = kern.f @ landmark_values(kern, z, v, k_valid, num_landmarks)
        if return_delta:
            return jnp.zeros((), ct)
        return jnp.where(q_valid[:, None], out, 0.0)
    # δ lives on the diagonal, so only positions that are both a valid query and a
    # valid key take part (for self-attention padding these are the same positions).
    diag_valid = q_valid & k_valid
    rows, row_valid = _sampled_rows(
        diag_valid, shift, delta_rows(shift, num_delta_rows, num_landmarks))
    kern, diag, f_rows = _shifted_kernels(q, k, q_landmark_valid, k_valid, rows,
                                          num_landmarks)
    z = iterative_pinv(kern.a, pinv_iterations, pinv_init, norm=pinv_scale)
    if shift == "split":
        residual, room, bv = _split_trace_terms(kern, z, v, diag, diag_valid, row_valid)
    else:
        residual, room = _paired_trace_terms(kern, z, rows, f_rows, diag, row_valid)
        bv = None
    # δ makes the trace of (1 − δ) F Z B + δ I match S's (over the sampled rows). Clipped
    # to [0, 1] so that every row stays a convex mix of a Nyström row and an identity row
    # (summing to one wherever Nyström's rows do); δ = 0 when every token is its own
    # landmark (n_valid <= m), and when there is no valid row.
    delta = jnp.where(
        (_seq.total(diag_valid.sum()) > kern.key_landmark_valid.sum()) & (room > 0),
        jnp.clip(residual / jnp.where(room > 0, room, 1.0), 0.0, 1.0),
        0.0,
    )
    if return_delta:
        return delta
    delta = _seq.varying(delta)  # broadcast over this shard's tokens below
    w = landmark_values(kern, z, v, k_valid, num_landmarks, bv=bv)
    # A valid query whose own key is padding has no diagonal entry to shift weight to.
    keep = jnp.where(diag_valid, 1.0 - delta, 1.0)[:, None]
    # Scaling F's rows before the product (not the product after) lets the backward pass
    # take δ's cotangent from F ∘ (G Wᵀ), which it forms for F's anyway, instead of
    # recomputing F W.
    # v is already zero at padded keys (``_common.lift``), so δ·v adds nothing to a query
    # whose own key is padding; padded queries are zeroed below.
    out = (keep * kern.f) @ w + delta * v
    return jnp.where(q_valid[:, None], out, 0.0)


def _check_shift_args(
    method: str, query: Array, key: Array, shift: Any, num_delta_rows: Any
) -> None:
    _checks.choice(f"{method}()", "shift", shift, SHIFTS)
    _checks.positive_int(f"{method}()", "num_delta_rows", num_delta_rows, allow_none=True)
    if query.shape[-3] != key.shape[-3]:
        raise UsageError(
            f"{method}(): spectral shifting adds δ·I, so it needs self-attention shapes with "
            f"q_len == kv_len; got q_len={query.shape[-3]}, kv_len={key.shape[-3]}. Use "
            "nystrom_attention for cross-attention."
        )


def _shift_core(
    p: Prologue, query: Array, key: Array, num_landmarks: int, pinv_iterations: int,
    pinv_init: str, shift: str, num_delta_rows: int | None, *, return_delta: bool,
) -> Any:
    """:func:`_shift_head` bound to one call's parameters and global pinv normaliser."""
    return functools.partial(
        _shift_head, scale=p.scale, num_landmarks=num_landmarks,
        pinv_iterations=pinv_iterations, pinv_init=pinv_init, shift=shift,
        num_delta_rows=num_delta_rows, return_delta=return_delta,
        pinv_scale=global_pinv_norm(
            query, key, p.landmark_valid, p.key_valid, scale=p.scale,
            num_landmarks=num_landmarks, pinv_init=pinv_init, pinv_iterations=pinv_iterations),
    )


@_common.drop_in_signature
def spectral_shift_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    num_landmarks: int = 64,
    pinv_iterations: int | None = 6,
    pinv_init: str = "per_matrix",
    shift: str = "paired",
    num_delta_rows: int | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Spectrally shifted Nyström attention: S ≈ (1 − δ)·F Z B + δ·I, out = (1 − δ)·F(Z(BV)) + δ·V.

    F, A, B are Nyströmformer's three landmark softmax kernels (:func:`nystrom_attention`)
    and Z ≈ A⁺ by the iterative pseudo-inverse. The shift δ is taken from the diagonal of
    the Nyström residual S − F Z B, so that the approximation has S's trace:

        δ = clip((tr S − tr(F Z B)) / (n_valid − tr(F Z B)), 0, 1),

    with n_valid the valid tokens; δ = 0 when n_valid ≤ m_valid (every token its own
    landmark). The low-rank part is scaled by 1 − δ, not just added to: each row becomes a
    convex mix of a Nyström row and an identity row, so it sums to one, as a row of S does,
    wherever the Nyström row does (Nyström plus δ·I would sum to 1 + δ). This is the
    spectral-shifting Nyström model of Wang et al. (2014), K ≈ C̄ W̄⁺ C̄ᵀ + δI with C̄, W̄
    taken from K − δI, once the shift is carried into the landmark kernels, which are close
    to (1 − δ)·F, A, B when S is near the identity. On near-identity attention the error
    stays at that of S ≈ I itself, at intermediate sharpness it is flat in m within the seed
    spread, and elsewhere it falls with m as Nyström's does (`bench error`, see
    ``benchmarks/README.md``). The two traces are obtained by ``shift``:

    - ``"paired"`` (default, O(s·n·d + s·m²)): both from the same s sampled rows i,
      δ = clip(Σ_i (S_ii − N_ii) / Σ_i (1 − N_ii), 0, 1) with N_ii = F_i Z B_{:,i}: a ratio
      estimator whose numerator and denominator share their sampling error. The rows are
      spread evenly over the valid tokens (every valid token once when there are at most s),
      each S_ii with its exact row normaliser; exact when both diagonals are constant.
    - ``"split"``: tr S as n_valid times the mean of S_ii over the s sampled rows, tr(F Z B)
      = tr(Z·(BF)) exact over all n rows, O(n·m²); the two traces carry different errors.
    - ``"exact"``: every row, O(n²); for tests and small n.
    - ``"zero"``: δ = 0, which is exactly :func:`nystrom_attention`.

    The gradient flows through δ (on sharp inputs it carries most of the query and key
    gradients, ``benchmarks/spectral_shift_delta_gradient.py``).

    On diffuse attention tr S ≈ 1 and δ ≈ 0 (the method reduces to Nyströmformer); on sharp,
    near-identity attention tr S ≈ n and δ ≈ 1 restores the diagonal that a rank-m
    approximation cannot represent. An example with at most ``num_landmarks`` valid keys gets
    exact softmax attention (δ = 0), as in :func:`nystrom_attention`, whatever its padding.
    Masks are handled as in :func:`nystrom_attention`.

    Args:
      query: float ``(batch..., n, heads, head_dim)``; bf16 in, bf16 out (float32 inside).
      key: float ``(batch..., n, heads, head_dim)`` (same length as query: δ·I is square).
      value: float ``(batch..., n, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, n, n)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False.
      num_landmarks: m segment-means landmarks.
      pinv_iterations: iterations of :func:`iterative_pinv` (None = exact pinv).
      pinv_init: ``"per_matrix"`` or ``"global"``.
      shift: ``"paired"``, ``"split"``, ``"exact"`` or ``"zero"`` (how δ is obtained).
      num_delta_rows: s, the diagonal rows sampled by ``"paired"`` and ``"split"``; None:
        max(32, m // 2) for ``"paired"``, m for ``"split"``.

    Returns:
      ``(batch..., n, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes (including q_len != kv_len), ``bias`` given, bad
        ``num_landmarks``/``pinv_iterations``/``pinv_init``/``shift``, a non-positive
        ``num_delta_rows``, non-padding mask.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).
      spectral_jax.UsageTypeError: non-float inputs, non-bool mask, unknown keywords.

    References:
      Verma 2021, "Beyond Nyströmformer – Approximation of self-attention by spectral
      shifting", arXiv:2103.05638; Wang, Zhang, Qian & Zhang 2014, "Improving the modified
      Nyström method using spectral shifting", KDD (the shifted model; here δ matches tr S
      rather than their δ^ss, which needs S's top eigenvalues).

    Example:
      >>> import jax
      >>> from spectral_jax.attention import spectral_shift_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> spectral_shift_attention(q, k, v, num_landmarks=16).shape
      (2, 128, 4, 16)
    """
    method = "spectral_shift_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    check_landmark_args(method, num_landmarks, pinv_iterations, pinv_init, head_chunk_size)
    _check_shift_args(method, query, key, shift, num_delta_rows)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    if num_landmarks >= _seq.global_length(query.shape[-3]):
        return _softmax.softmax_attention(
            query, key, value, mask=mask, scale=p.scale, query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths)
    head = _shift_core(p, query, key, num_landmarks, pinv_iterations, pinv_init, shift,
                       num_delta_rows, return_delta=False)
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid, p.landmark_valid,
        method=method, head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)


def spectral_shift_delta(
    query: Array,
    key: Array,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    num_landmarks: int = 64,
    pinv_iterations: int | None = 6,
    pinv_init: str = "per_matrix",
    shift: str = "paired",
    num_delta_rows: int | None = None,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
) -> Array:
    """The spectral shift δ that :func:`spectral_shift_attention` would use, per batch and head.

    Args:
      query, key: float ``(batch..., n, heads, head_dim)``.
      mask: as in :func:`spectral_shift_attention`, as are ``scale``, ``num_landmarks``,
        ``pinv_iterations``, ``pinv_init``, ``shift``, ``num_delta_rows``,
        ``query_seq_lengths`` and ``key_value_seq_lengths``.

    Returns:
      float32 (or wider) ``(batch..., heads)``, 0 ≤ δ ≤ 1 (dimensionless: a weight on V).

    Raises:
      ValueError, TypeError: as :func:`spectral_shift_attention`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import spectral_shift_delta
      >>> q = 4.0 * jax.random.normal(jax.random.key(0), (2, 128, 4, 16))
      >>> delta = jax.jit(spectral_shift_delta, static_argnames="num_landmarks")
      >>> bool((delta(q, q, num_landmarks=16) > 0.5).all())  # sharp: δ near 1
      True
    """
    method = "spectral_shift_delta"
    _common.check_qkv(method, query, key, key)
    check_landmark_args(method, num_landmarks, pinv_iterations, pinv_init)
    _check_shift_args(method, query, key, shift, num_delta_rows)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    ct = _common.compute_dtype(query.dtype)
    if num_landmarks >= _seq.global_length(query.shape[-3]):
        return jnp.zeros(query.shape[:-3] + query.shape[-2:-1], ct)
    head = _shift_core(p, query, key, num_landmarks, pinv_iterations, pinv_init, shift,
                       num_delta_rows, return_delta=True)
    b = p.query_valid.shape[0]
    flat = lambda x: x.reshape(b, *x.shape[-3:])  # noqa: E731
    fn = jax.vmap(jax.vmap(head, in_axes=(1, 1, 1, 0, 0, 0)))
    delta = fn(flat(query), flat(key), flat(key), p.query_valid, p.key_valid, p.landmark_valid)
    if p.mask_ok is not None:  # a traced mask that is not a padding mask: NaN, never silent
        delta = jnp.where(p.mask_ok[:, None], delta, jnp.nan)
    return delta.reshape(query.shape[:-3] + query.shape[-2:-1])
