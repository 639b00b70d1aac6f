"""Nyström with a diagonal (per-token) or spectral (one δ) shift, for SPSD kernels K(X, X)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _common
from spectral_jax.attention.core._landmarks import segment_means
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.landmark._nystrom import check_landmark_args
from spectral_jax.attention.landmark._pinv import iterative_pinv
from spectral_jax.attention.landmark._skyformer import gaussian_kernel

Array = jax.Array

KERNELS = ("softmax", "gaussian")
SHIFTS = ("diagonal", "trace", "none")


def _psd_pinv(a: Array, pinv_iterations: int | None) -> Array:
    if pinv_iterations is not None:
        return iterative_pinv(a, pinv_iterations)
    return jnp.linalg.pinv(a, hermitian=True)


def _symmetric_head(
    x: Array, v: Array, valid: Array, *, scale: float, kernel: str, num_landmarks: int,
    pinv_iterations: int | None, normalize: bool, shift: str,
) -> Array:
    ct = _common.compute_dtype(x.dtype)
    x = jnp.where(valid[:, None], x.astype(ct), 0.0)
    v = jnp.where(valid[:, None], v.astype(ct), 0.0)
    lm, lm_valid = segment_means(x, valid, num_landmarks)
    root = scale**0.5
    sq = jnp.sum(x * x, -1)
    top = 0.0
    if kernel == "gaussian":
        dsc = valid.astype(ct)
    else:
        # exp(s·xᵢ·xⱼ) = Dᵢ·G_ij·Dⱼ with G the Gaussian kernel exp(−s‖xᵢ − xⱼ‖²/2) and
        # Dᵢ = exp(s‖xᵢ‖²/2). Nyström of D G D with landmarks X̃ is D·(Nyström of G)·D (D_X̃
        # cancels), so the factors below are G's: unit diagonal, entries in (0, 1], well
        # conditioned. Row normalisation cancels Dᵢ; Dⱼ/max D (half the exponent range of
        # exp(s·x·y − s·max‖x‖²)) scales the values. K itself underflows in float32 for
        # tokens of different norms, and its W⁺ loses the small tokens' directions.
        top = jnp.max(jnp.where(valid, sq, -jnp.inf))
        top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
        dsc = jnp.where(valid, jnp.exp(0.5 * scale * (sq - top)), 0.0)
    # The landmarks' own D (over the same max), needed only to form K for shift="trace".
    dl = jnp.exp(0.5 * scale * (jnp.sum(lm * lm, -1) - top)) if kernel == "softmax" else (
        jnp.ones(lm.shape[0], ct))
    c = gaussian_kernel(x * root, lm * root) * (valid[:, None] & lm_valid[None, :])  # (n, m)
    w = gaussian_kernel(lm * root, lm * root) * (lm_valid[:, None] & lm_valid[None, :])
    w_pinv = _psd_pinv(w, pinv_iterations)
    cw = c @ w_pinv  # (n, m): C W⁺, so that C W⁺ Cᵀ is never formed
    dv = dsc[:, None] * v
    if shift == "diagonal":
        # diag(G − C W⁺ Cᵀ), the Nyström residual's diagonal (G_ii = 1): ≥ 0 for an SPSD G (a
        # Schur complement), up to rounding and an inexact W⁺, hence the clip. O(n·m²).
        resid = jnp.where(valid, jnp.maximum(1.0 - jnp.sum(cw * c, -1), 0.0), 0.0)
        out = cw @ (c.T @ dv) + (resid * dsc)[:, None] * v
        den = cw @ (c.T @ dsc) + resid * dsc
    elif shift == "trace":
        # Wang et al.'s model is K ≈ C U Cᵀ + δI on K itself (δI on K is δ/DᵢDⱼ on G, not a
        # diagonal of G), so it is built from K's own columns, scaled by exp(−s·max‖x‖²).
        kc = c * (dsc[:, None] * dl[None, :])
        kw = w * (dl[:, None] * dl[None, :])
        kw_pinv = _psd_pinv(kw, pinv_iterations)
        n_valid, m_valid = valid.sum(), lm_valid.sum()
        ctc = kc.T @ kc
        trace_k = jnp.sum(dsc * dsc)
        delta = jnp.where(
            n_valid > m_valid,
            jnp.maximum(trace_k - jnp.sum(kw_pinv * ctc), 0.0) / jnp.maximum(n_valid - m_valid, 1),
            0.0,
        )
        u = kw_pinv - delta * _psd_pinv(ctc, pinv_iterations)
        out = kc @ (u @ (kc.T @ v)) + delta * v
        den = kc @ (u @ kc.sum(0)) + delta * valid
    else:
        out = cw @ (c.T @ dv)
        den = cw @ (c.T @ dsc)
    if normalize:
        out = out / jnp.where(jnp.abs(den) > 1e-30, den, 1.0)[:, None]
    return jnp.where(valid[:, None], out, 0.0)


@_common.drop_in_signature
def symmetric_spectral_shift_attention(
    query: Array,
    key: Array | None,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    kernel: str = "softmax",
    num_landmarks: int = 64,
    pinv_iterations: int | None = None,
    normalize: bool | None = None,
    shift: str = "diagonal",
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Nyström of an SPSD attention kernel K(X, X), X = query = key, plus its residual's diagonal.

    For symmetric attention (keys equal to queries, Courtois et al. 2024) the kernels
    ``"softmax"`` K = exp(s·XXᵀ) (PSD: a Gaussian kernel between diagonal scalings) and
    ``"gaussian"`` K = exp(−s‖x_i − x_j‖²/2) are SPSD with a diagonal known in O(n·d). With
    segment-means landmarks X̃ (:func:`segment_means`), C = K(X, X̃) and W = K(X̃, X̃), the
    Nyström residual R = K − C W⁺ Cᵀ is a Schur complement of a PSD matrix, so it is PSD and
    its diagonal r_i = K_ii − (C W⁺)_i·C_i ≥ 0 costs O(n·m²). ``shift`` chooses the
    correction added to C W⁺ Cᵀ:

    - ``"diagonal"`` (default): K ≈ C W⁺ Cᵀ + diag(r), out = C W⁺(CᵀV) + r ⊙ V. Among all
      diagonal corrections diag(r) is closest to R in Frobenius norm (it removes R's diagonal
      exactly), so the unnormalised kernel's Frobenius error is never above Nyström's (also
      with an iterative W⁺); each token gets its own shift, which is what tokens of varying
      norm need. After row normalisation there is no such bound; the table below measures
      it.
    - ``"trace"``: Wang et al.'s spectral-shifting model with a Nyström core, one shift
      δ = max(0, (tr K − tr(W⁺CᵀC)) / (n_valid − m_valid)) (the mean of r),
      U = W⁺ − δ(CᵀC)⁺, K ≈ C U Cᵀ + δI. One δ cannot model a diagonal that varies: with the
      softmax kernel on q = k ~ N(0, 1) its output error is several times Nyström's.
    - ``"none"``: plain Nyström, K ≈ C W⁺ Cᵀ.

    With ``normalize`` each row is divided by its approximated row sum (C W⁺(Cᵀ1) + r, etc.).
    Relative output error against exact softmax attention, symmetric attention on each
    ``bench error`` regime's query (n = 1024, head_dim = 64, m = 64, float32, median of 3
    seeds; ``benchmarks/symmetric_shift_error.py``):

    ============  =========  ==============  ======  =======  ==========
    regime        nystrom    spectral_shift  none    trace    diagonal
    ============  =========  ==============  ======  =======  ==========
    diffuse       0.997      0.381           0.990   12.5     0.120
    sharp         0.982      2.0e-4          0.984   2.0e-4   1.9e-4
    random_walk   0.135      0.116           0.136   0.286    0.109
    varying_norm  1.61       1.08            1.000   1.09     0.998
    ============  =========  ==============  ======  =======  ==========

    With n_valid ≤ m every token is its own landmark and the result is exact (r = 0).
    ``normalize`` defaults to True for ``"softmax"`` (softmax-like rows) and False for
    ``"gaussian"`` (kernelized attention is unnormalised). The softmax kernel is computed as
    D·G·D (Dᵢ = exp(s‖xᵢ‖²/2), G the Gaussian kernel; Nyström of D G D is D·(Nyström of G)·D),
    so its factors stay well conditioned for tokens of very different norms; rows whose
    approximate normaliser nearly cancels can still change visibly with rounding (e.g. between
    ``head_chunk_size`` settings). For general (non-symmetric)
    softmax attention use :func:`spectral_shift_attention`.

    Args:
      query: float ``(batch..., n, heads, head_dim)``, the shared query/key X.
      key: None or the same array as ``query``; anything else is rejected.
      value: float ``(batch..., n, heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, n, n)``.
      scale: s, default ``1/sqrt(head_dim)``.
      is_causal: must be False.
      kernel: ``"softmax"`` or ``"gaussian"``.
      num_landmarks: m.
      pinv_iterations: None (default) for exact symmetric pseudo-inverses (the closed forms
        assume them), or an iteration count for :func:`iterative_pinv`.
      normalize: divide rows by the approximated row sums (see above).
      shift: ``"diagonal"`` (per-token residual diagonal), ``"trace"`` (one δ) or ``"none"``
        (plain Nyström), see above.

    Returns:
      ``(batch..., n, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: ``key`` that is not ``query`` (checked by identity, or by value
        when both are concrete), bad shapes, ``bias``, unknown ``kernel`` or ``shift``, bad
        ``num_landmarks``.
      spectral_jax.UnsupportedError: ``is_causal=True``.

    References:
      Wang, Zhang, Qian & Zhang 2014, "Improving the modified Nyström method using spectral
      shifting", KDD, Thm. 1 (``"trace"``); Wang, Zhang & Zhang 2016, JMLR 17(210);
      Courtois et al. 2024, "Symmetric Dot-Product Attention for Efficient Training of BERT
      Language Models", Findings of ACL; Chen et al. 2021 (Skyformer), Lemma 1.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import symmetric_spectral_shift_attention
      >>> x, v = jax.random.normal(jax.random.key(0), (2, 2, 128, 4, 16))
      >>> symmetric_spectral_shift_attention(x, x, v, num_landmarks=16).shape
      (2, 128, 4, 16)
    """
    method = "symmetric_spectral_shift_attention"
    _common.check_flax_kwargs(method, flax_kwargs)
    if key is None:
        key = query
    _common.check_qkv(method, query, key, value)
    if key is not query and (
        isinstance(key, jax.core.Tracer) or isinstance(query, jax.core.Tracer)
        or not bool(jnp.array_equal(key, query))
    ):
        raise UsageError(
            f"{method}(): symmetric attention needs key == query (an SPSD kernel K(X, X)); "
            "pass the same array for both, or key=None. Use spectral_shift_attention for "
            "general keys."
        )
    _common.reject_bias(method, bias)
    _common.reject_causal(method, is_causal)
    _checks.choice(f"{method}()", "kernel", kernel, KERNELS)
    _checks.reject_traced(f"{method}()", "normalize", normalize)
    _checks.choice(f"{method}()", "shift", shift, SHIFTS)
    check_landmark_args(method, num_landmarks, pinv_iterations, "per_matrix")
    if normalize is None:
        normalize = kernel == "softmax"
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(
        _symmetric_head, scale=p.scale, kernel=kernel, num_landmarks=num_landmarks,
        pinv_iterations=pinv_iterations, normalize=bool(normalize), shift=shift,
    )
    # The per-head core takes one point set; lift() passes (q, k, v, q_valid, k_valid).
    core = lambda q, k, v, qv, kv: head(q, v, qv & kv)  # noqa: E731
    return _common.lift(
        core, query, key, value, p.query_valid, p.key_valid,
        method=method, head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)
