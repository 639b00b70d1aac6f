"""Nyströmformer: softmax attention through segment-means landmarks and an iterative
pseudo-inverse."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._landmarks import segment_means
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.exact import _softmax
from spectral_jax.attention.landmark._pinv import PINV_INITS, iterative_pinv, pinv_norm

Array = jax.Array


class LandmarkKernels(NamedTuple):
    """The three softmax kernels of one head (Xiong et al. 2021, eq. 14)."""

    f: Array  # (n, m) softmax(Q K̃ᵀ): queries against key landmarks
    a: Array  # (m, m) softmax(Q̃ K̃ᵀ): landmarks against landmarks
    b: Array  # (m, n) softmax(Q̃ Kᵀ): query landmarks against keys
    key_landmark_valid: Array  # (m,) bool
    key_landmarks: Array  # (m, d)
    f_logits: Array  # (n, m) Q K̃ᵀ before the softmax (spectral shifting reuses it)


def landmark_kernels(
    q: Array, k: Array, q_valid: Array, k_valid: Array, num_landmarks: int
) -> LandmarkKernels:
    """Builds F, A, B for one head from already-scaled queries; padding never enters.

    Empty landmarks (fewer valid tokens than landmarks) are masked as keys and zeroed as
    queries, which leaves zero rows/columns that the pseudo-inverse iteration keeps at zero.
    """
    q_lm, q_lm_valid = segment_means(q, q_valid, num_landmarks)
    k_lm, k_lm_valid = segment_means(k, k_valid, num_landmarks)
    f_logits = q @ k_lm.T
    f = _common.masked_softmax(f_logits, k_lm_valid[None, :])
    a = _common.masked_softmax(q_lm @ k_lm.T, k_lm_valid[None, :]) * q_lm_valid[:, None]
    # B spans every key: on a split sequence its normaliser is a distributed log-sum-exp.
    b = _seq.softmax(q_lm @ k.T, k_valid[None, :]) * q_lm_valid[:, None]
    return LandmarkKernels(f, a, b, k_lm_valid, k_lm, f_logits)


def check_landmark_args(
    method: str, num_landmarks: Any, pinv_iterations: Any, pinv_init: Any,
    head_chunk_size: Any = None,
) -> None:
    """The landmark parameters; ``head_chunk_size`` too for the methods whose
    ``num_landmarks >= length`` path returns exact attention without reaching ``lift``."""
    _checks.positive_int(f"{method}()", "num_landmarks", num_landmarks)
    _checks.reject_traced(f"{method}()", "pinv_iterations", pinv_iterations)
    if pinv_iterations is not None and (
        isinstance(pinv_iterations, bool)
        or not isinstance(pinv_iterations, (int, np.integer))
        or pinv_iterations < 0
    ):
        raise UsageError(
            f"{method}(): `pinv_iterations` must be a non-negative int, or None for an exact "
            f"pseudo-inverse; got {pinv_iterations!r}."
        )
    _checks.choice(f"{method}()", "pinv_init", pinv_init, PINV_INITS)
    _checks.positive_int(f"{method}()", "head_chunk_size", head_chunk_size, allow_none=True)


def global_pinv_norm(
    query: Array, key: Array, q_landmark_valid: Array, k_valid: Array, *, scale: Any,
    num_landmarks: int, pinv_init: str, pinv_iterations: int | None,
) -> Array | None:
    """``pinv_init="global"``'s one Z_0 scale over every (example, head) of the call, else None.

    Taken over the whole (batch, heads) stack of landmark matrices A before the per-head
    code runs, as the reference code does over its (batch, heads, m, m) tensor, and passed
    in: a ``pmax`` collective inside the vmap over heads has no derivative, fails inside
    ``shard_map``, and forced every slice into one step. Rebuilding A costs O(n·d + m²·d)
    per head, small beside the O(n·m·d) kernels. ``query`` and ``key`` are
    ``(batch..., len, heads, head_dim)``; the masks are ``(B, H, len)``.
    """
    if pinv_init != "global" or pinv_iterations is None:
        return None

    def landmark_matrix(q: Array, k: Array, q_ok: Array, k_ok: Array) -> Array:
        ct = _common.compute_dtype(q.dtype)
        q_lm, q_lm_valid = segment_means(q.astype(ct) * scale, q_ok, num_landmarks)
        k_lm, k_lm_valid = segment_means(k.astype(ct), k_ok, num_landmarks)
        a = _common.masked_softmax(q_lm @ k_lm.T, k_lm_valid[None, :])
        return a * q_lm_valid[:, None]

    b = k_valid.shape[0]
    q, k = (x.reshape(b, *x.shape[-3:]) for x in (query, key))
    a = jax.vmap(jax.vmap(landmark_matrix, in_axes=(1, 1, 0, 0)))(
        q, k, q_landmark_valid, k_valid)
    return pinv_norm(a, "global")


def landmark_values(
    kern: LandmarkKernels, z: Array, v: Array, k_valid: Array, num_landmarks: int,
    bv: Array | None = None,
) -> Array:
    """Z(BV), the (m, d) right factor of F Z B V; exact values when every key is a landmark.

    With n_valid keys ≤ m, each valid key is its own landmark and F is exactly the softmax
    over the valid keys, so F·V at those keys is exact attention: the answer the static
    ``num_landmarks >= kv_len`` shortcut gives, here whatever the padding, so an example's
    output never depends on how far its batch-mates pad it. ``bv``: B V if already formed.
    """
    zbv = z @ (_seq.total(kern.b @ v) if bv is None else bv)
    key_values = segment_means(v, k_valid, num_landmarks)[0]
    return jnp.where(_seq.total(k_valid.sum()) <= num_landmarks, key_values, zbv)


def _nystrom_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, q_landmark_valid: Array, *,
    scale: float, num_landmarks: int, pinv_iterations: int | None, pinv_init: str,
    pinv_scale: Array | None,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    q, k, v = q.astype(ct) * scale, k.astype(ct), v.astype(ct)
    kern = landmark_kernels(q, k, q_landmark_valid, k_valid, num_landmarks)
    z = iterative_pinv(kern.a, pinv_iterations, pinv_init, norm=pinv_scale)
    # Right-to-left keeps every product O(n m d): never form the n x n matrix.
    out = kern.f @ landmark_values(kern, z, v, k_valid, num_landmarks)
    return jnp.where(q_valid[:, None], out, 0.0)


@_common.drop_in_signature
def nystrom_attention(
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
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Nyströmformer attention: softmax(QK̃ᵀ) · A⁺ · softmax(Q̃Kᵀ) · V in O(n·m) time and memory.

    Landmarks Q̃, K̃ are the means of ``num_landmarks`` contiguous segments of the *valid*
    tokens (see :func:`segment_means`), so any length works and padding never changes the
    valid outputs. A⁺ is approximated by ``pinv_iterations`` steps of :func:`iterative_pinv`.
    When an example has at most ``num_landmarks`` valid keys, each is its own landmark and
    its output is exact softmax attention, F·V (the reference code's shortcut, but decided
    per example from its valid keys, not from the padded length). The
    depthwise-convolution skip on V has parameters and lives in
    :class:`spectral_jax.nn.MultiHeadAttention`.

    Masks: ``mask`` must be a padding mask (``q_valid[:, None] & k_valid[None, :]``, as from
    ``flax.nnx.make_attention_mask``); it is reduced to per-(batch, head) key padding
    (``any`` over queries) and query padding (``any`` over keys). Padded keys get zero weight,
    padded queries give zero rows, and a query with no valid key gives zeros. A key padding
    mask alone (query axis of size 1, no ``query_seq_lengths``) says nothing about the
    queries; in self-attention shapes the query landmarks then skip padded key positions, so
    padded content still never reaches valid outputs.

    Args:
      query: float ``(batch..., q_len, heads, head_dim)`` (bf16 in, bf16 out; kernels,
        normalisers and landmark means in float32).
      key: float ``(batch..., kv_len, heads, head_dim)``.
      value: float ``(batch..., kv_len, heads, v_head_dim)``.
      bias: must be None (no additive bias without the full logit matrix).
      mask: optional bool padding mask broadcastable to ``(batch, heads, q_len, kv_len)``.
      scale: logit scale, default ``1/sqrt(head_dim)``.
      is_causal: must be False (landmarks mix future tokens).
      num_landmarks: m, the number of segment-means landmarks (reference codes: 32-256).
      pinv_iterations: iterations of the pseudo-inverse (6 in the paper); None = exact pinv.
      pinv_init: ``"per_matrix"`` (default) or ``"global"``, see :func:`iterative_pinv`.

    Returns:
      ``(batch..., q_len, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes, ``bias`` given, non-positive ``num_landmarks``, a bad
        ``pinv_iterations``/``pinv_init``, or a mask that is not a padding mask.
      spectral_jax.UnsupportedError: ``is_causal=True``, or one query against more keys
        under a mask: the call of Flax's ``MultiHeadAttention(decode=True)``, which this
        method cannot decode (one padded query: pass ``key_value_seq_lengths``).
      spectral_jax.UsageTypeError: non-float inputs, non-bool mask, unknown keywords.

    References:
      Xiong et al. 2021, "Nyströmformer: A Nyström-based Algorithm for Approximating
      Self-Attention", AAAI, eq. (14)-(15) and §3.3; reference code mlpen/Nystromformer.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import nystrom_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> nystrom_attention(q, k, v, num_landmarks=16).shape
      (2, 128, 4, 16)
    """
    method = "nystrom_attention"
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask)
    check_landmark_args(method, num_landmarks, pinv_iterations, pinv_init, head_chunk_size)
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    if num_landmarks >= _seq.global_length(key.shape[-3]):
        return _softmax.softmax_attention(
            query, key, value, mask=mask, scale=p.scale, query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths)
    head = functools.partial(
        _nystrom_head, scale=p.scale, num_landmarks=num_landmarks,
        pinv_iterations=pinv_iterations, pinv_init=pinv_init,
        pinv_scale=global_pinv_norm(
            query, key, p.landmark_valid, p.key_valid, scale=p.scale,
            num_landmarks=num_landmarks, pinv_init=pinv_init, pinv_iterations=pinv_iterations),
    )
    return _common.lift(
        head, query, key, value, p.query_valid, p.key_valid, p.landmark_valid,
        method=method, head_chunk_size=head_chunk_size, mask_ok=p.mask_ok,
    ).astype(query.dtype)
