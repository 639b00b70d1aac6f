"""Landmark selection: segment means over valid tokens, and evenly spaced or random positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spectral_jax import _checks
from spectral_jax.attention.core import _seq

Array = jax.Array


def segment_means(x: Array, valid: Array, num_landmarks: int) -> tuple[Array, Array]:
    """Means of ``num_landmarks`` contiguous segments of the *valid* tokens of one sequence.

    Segments are cut over the valid tokens in order (token with rank r among the n_valid valid
    ones goes to segment ⌊r·m/n_valid⌋), so padding, wherever it is, never shrinks a landmark
    toward zero, and the landmarks do not depend on how much padding follows. Lengths not
    divisible by m give segments of ⌊n_valid/m⌋ or ⌈n_valid/m⌉ tokens. When n_valid < m, only
    n_valid segments are non-empty: each valid token is its own landmark.

    Args:
      x: float ``(n, d)``.
      valid: bool ``(n,)``.
      num_landmarks: m.

    Returns:
      ``(landmarks (m, d) in x's dtype, landmark_valid bool (m,))``; empty segments are zero
      and marked invalid.

    References:
      Xiong et al. 2021, Nyströmformer, §3.2 (segment means); padding handling is ours.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import segment_means
      >>> x = jnp.arange(5.0)[:, None]            # tokens 0..4, the last one padding
      >>> means, ok = segment_means(x, jnp.array([1, 1, 1, 1, 0], bool), 2)
      >>> means[:, 0].tolist(), ok.tolist()
      ([0.5, 2.5], [True, True])
    """
    _checks.positive_int("segment_means()", "num_landmarks", num_landmarks)
    segment = segment_ids(valid, num_landmarks)
    sums = jax.ops.segment_sum(
        jnp.where(valid[:, None], x, 0).astype(jnp.promote_types(x.dtype, jnp.float32)),
        segment, num_segments=num_landmarks + 1,
    )[:num_landmarks]
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), segment, num_segments=num_landmarks + 1)
    # On a sequence split over devices: m sums and m counts per shard, one all-reduce.
    sums, counts = _seq.total((sums, counts[:num_landmarks]))
    means = sums / jnp.maximum(counts, 1)[:, None]
    return means.astype(x.dtype), counts > 0


def segment_ids(valid: Array, num_landmarks: int) -> Array:
    """Segment of each token for :func:`segment_means`; padded tokens get ``num_landmarks``.

    On a sequence split over devices the ranks and the count are global (one all-gather of
    each shard's count), so a token lands in the same segment as on one device.
    """
    n_valid = _seq.total(valid.sum())
    rank = jnp.cumsum(valid) - 1 + _seq.exclusive_prefix(valid.sum())
    segment = (rank * num_landmarks) // jnp.maximum(n_valid, 1)
    return jnp.where(valid, segment, num_landmarks)


def evenly_spaced_positions(valid: Array, num: int) -> Array:
    """``num`` positions spread evenly over the valid tokens (the centres of equal strata).

    With ``num == n_valid`` this is every valid position once. Returns int32 ``(num,)``; for a
    sequence with no valid token it returns position 0 (callers mask it out).
    """
    n_valid = _seq.total(valid.sum())
    ranks = ((jnp.arange(num) * 2 + 1) * n_valid) // (2 * num)
    return position_of_rank(valid, ranks)


def random_positions(rng: Array, valid: Array, num: int) -> Array:
    """``num`` positions drawn uniformly with replacement from the valid tokens (Skyformer)."""
    n_valid = _seq.total(valid.sum())
    ranks = jnp.floor(jax.random.uniform(rng, (num,)) * n_valid).astype(jnp.int32)
    return position_of_rank(valid, jnp.minimum(ranks, jnp.maximum(n_valid - 1, 0)))


def position_of_rank(valid: Array, ranks: Array) -> Array:
    """The position of each rank-th valid token (the last position for a rank past them all).

    The k-th valid token is the first position where the running count exceeds k, for any
    padding side (left, right or holes). On a sequence split over devices the counts and
    positions are global: the shard holding a rank gives its position, one all-reduce of
    ``ranks.size`` numbers.
    """
    counts = jnp.cumsum(valid)
    n = valid.shape[0]
    if _seq.active() is None:
        return jnp.minimum(jnp.searchsorted(counts, ranks + 1), n - 1).astype(jnp.int32)
    before = _seq.exclusive_prefix(counts[-1])
    held = (ranks >= before) & (ranks < before + counts[-1])
    local = jnp.searchsorted(counts + before, ranks + 1)
    position = _seq.total(jnp.where(held, local + _seq.offset(n), 0))
    last = _seq.global_length(n) - 1
    return jnp.where(_seq.total(held.astype(jnp.int32)) > 0, position, last).astype(jnp.int32)
