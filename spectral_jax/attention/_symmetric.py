"""Spectral shifting for SPSD kernels, where Wang et al.'s closed forms hold exactly."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention import _common
from spectral_jax.attention._landmarks import segment_means
from spectral_jax.attention._nystrom import check_landmark_args
from spectral_jax.attention._pinv import iterative_pinv
from spectral_jax.attention._skyformer import gaussian_kernel

Array = jax.Array

KERNELS = ("softmax", "gaussian")


def _psd_pinv(a: Array, pinv_iterations: int | None) -> Array:
    if pinv_iterations is not None:
        return iterative_pinv(a, pinv_iterations)
    return jnp.linalg.pinv(a, hermitian=True)


def _symmetric_head(
    x: Array, v: Array, valid: Array, *, scale: float, kernel: str, num_landmarks: int,
    pinv_iterations: int | None, normalize: bool, shift: bool,
) -> Array:
    ct = _common.compute_dtype(x.dtype)
    x = jnp.where(valid[:, None], x.astype(ct), 0.0)
    v = jnp.where(valid[:, None], v.astype(ct), 0.0)
    lm, lm_valid = segment_means(x, valid, num_landmarks)
    if kernel == "gaussian":
        root = scale**0.5
        kern = lambda a, b: gaussian_kernel(a * root, b * root)  # noqa: E731
        diag = jnp.ones(x.shape[0], ct)
    else:
        # exp(s·x·y − s·max‖x‖²) ≤ 1 by Cauchy–Schwarz: a constant factor that every closed
        # form below carries linearly, and that row normalisation removes.
        top = jnp.max(jnp.where(valid, jnp.sum(x * x, -1), -jnp.inf))
        top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
        kern = lambda a, b: jnp.exp(scale * (a @ b.T - top))  # noqa: E731
        diag = jnp.exp(scale * (jnp.sum(x * x, -1) - top))
    c = kern(x, lm) * (valid[:, None] & lm_valid[None, :])  # (n, m) columns of K
    w = kern(lm, lm) * (lm_valid[:, None] & lm_valid[None, :])  # (m, m)
    w_pinv = _psd_pinv(w, pinv_iterations)
    ctc = c.T @ c
    u = w_pinv
    delta = jnp.zeros((), ct)
    if shift:
        n_valid, m_valid = valid.sum(), lm_valid.sum()
        trace_k = jnp.sum(jnp.where(valid, diag, 0.0))
        delta = jnp.where(
            n_valid > m_valid,
            jnp.maximum(trace_k - jnp.sum(w_pinv * ctc), 0.0) / jnp.maximum(n_valid - m_valid, 1),
            0.0,
        )
        u = w_pinv - delta * _psd_pinv(ctc, pinv_iterations)
    out = c @ (u @ (c.T @ v)) + delta * v
    if normalize:
        den = c @ (u @ c.sum(0)) + delta * valid
        out = out / jnp.where(jnp.abs(den) > 1e-30, den, 1.0)[:, None]
    return jnp.where(valid[:, None], out, 0.0)


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
    shift: bool = True,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Spectral shifting of an SPSD attention kernel K(X, X) with X = query = key.

    For symmetric attention (keys equal to queries, Courtois et al. 2024) the kernels
    ``"softmax"`` K = exp(s·XXᵀ) (PSD: a Gaussian kernel between diagonal scalings) and
    ``"gaussian"`` K = exp(−s‖x_i − x_j‖²/2) are SPSD with a diagonal known in O(n·d). With
    segment-means landmarks X̃ (:func:`segment_means`), C = K(X, X̃) and W = K(X̃, X̃),
    Wang et al.'s spectral-shifting model with a Nyström core gives, in O(n·m² + m³),

        δ = max(0, (tr K − tr(W⁺CᵀC)) / (n_valid − m_valid)),   U = W⁺ − δ(CᵀC)⁺,
        K ≈ C U Cᵀ + δ I,   out = C(U(CᵀV)) + δV   (divided by C(U(Cᵀ1)) + δ if normalize).

    δ is the mean of the Nyström residual's diagonal, ≥ 0 because the residual is a Schur
    complement of a PSD matrix. With n_valid ≤ m every token is its own landmark and the
    result is exact. ``normalize`` defaults to True for ``"softmax"`` (softmax-like rows)
    and False for ``"gaussian"`` (kernelized attention is unnormalised).

    Caution: one δ models the whole diagonal, so this works when K's diagonal is nearly
    constant (the Gaussian kernel's is 1; softmax with tokens of similar norms). With the
    softmax kernel on q = k ~ N(0, 1), K_ii = exp(s‖x_i‖²) spans orders of magnitude and the
    normalised output is far off: relative error 4.6 / 4.9 / 7.2 at (n, m, d) = (9, 4, 4),
    (64, 8, 16), (256, 16, 32) in float64, against 0.43 / 0.90 / 0.97 with ``shift=False``.
    The same inputs are ill-conditioned in float32, where results change visibly with
    rounding (e.g. between ``head_chunk_size`` settings). For general softmax attention use
    :func:`spectral_shift_attention`.

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
      shift: False gives the plain Nyström approximation C W⁺ Cᵀ (δ = 0).
      query_seq_lengths, key_value_seq_lengths: optional int ``(batch...,)``: how many
        leading queries / keys of each example are valid (O(n) right padding, as in
        ``jax.nn.dot_product_attention``), combined with ``mask`` by ``and``.
      head_chunk_size: (example, head) slices per step, each rematerialised in the
        backward pass; None: about 4096 tokens' worth on CPU for long inputs, else all.
      **flax_kwargs: Flax ``attention_fn`` keywords, accepted; weight dropout asked for
        (``dropout_rate > 0``, not ``deterministic``) raises NotImplementedError.

    Returns:
      ``(batch..., n, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      ValueError: ``key`` that is not ``query`` (checked by identity, or by value when both
        are concrete), bad shapes, ``bias``, unknown ``kernel``, bad ``num_landmarks``.
      NotImplementedError: ``is_causal=True``.

    References:
      Wang, Zhang, Qian & Zhang 2014, "Improving the modified Nyström method using spectral
      shifting", KDD, Thm. 1; Wang, Zhang & Zhang 2016, JMLR 17(210); Courtois et al. 2024,
      "Symmetric Dot-Product Attention for Efficient Training of BERT Language Models",
      Findings of ACL; Chen et al. 2021 (Skyformer), Lemma 1.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import symmetric_spectral_shift_attention
      >>> x, v = jax.random.normal(jax.random.key(0), (2, 1, 128, 2, 16))
      >>> symmetric_spectral_shift_attention(x, x, v, num_landmarks=16).shape
      (1, 128, 2, 16)
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
        raise ValueError(
            f"{method}(): symmetric attention needs key == query (an SPSD kernel K(X, X)); "
            "pass the same array for both, or key=None. Use spectral_shift_attention for "
            "general keys."
        )
    _common.reject_bias(method, bias)
    _common.reject_causal(method, is_causal)
    _common.check_choice(method, "kernel", kernel, KERNELS)
    _common.reject_traced(method, "normalize", normalize)
    _common.reject_traced(method, "shift", shift)
    check_landmark_args(method, num_landmarks, pinv_iterations, "per_matrix")
    scale = _common.default_scale(method, scale, query.shape[-1])
    if normalize is None:
        normalize = kernel == "softmax"
    q_valid, k_valid, mask_ok = _common.padding_from_mask(
        method, mask, query, key, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, with_check=True)
    head = functools.partial(
        _symmetric_head, scale=scale, kernel=kernel, num_landmarks=num_landmarks,
        pinv_iterations=pinv_iterations, normalize=bool(normalize), shift=bool(shift),
    )
    # The per-head core takes one point set; lift() passes (q, k, v, q_valid, k_valid).
    core = lambda q, k, v, qv, kv: head(q, v, qv & kv)  # noqa: E731
    return _common.lift(
        core, query, key, value, q_valid, k_valid,
        method=method, head_chunk_size=head_chunk_size, mask_ok=mask_ok,
    ).astype(query.dtype)
