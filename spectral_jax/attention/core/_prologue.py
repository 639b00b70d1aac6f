"""What every approximate method computes before its per-head core, in one call.

A method file checks its own arguments, calls :func:`prologue`, and lifts its per-head core
with :func:`spectral_jax.attention.core._common.lift` on the validity masks returned here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._padding import landmark_query_valid, padding_from_mask

Array = jax.Array


class Prologue(NamedTuple):
    """The scale and the validity masks of one call, with the batch dims flattened to ``B``.

    Attributes:
      scale: the logit scale, ``1/sqrt(head_dim)`` for None (a traced scalar passes through).
      query_valid: bool ``(B, H, q_len)``, the queries the mask and lengths keep.
      key_valid: bool ``(B, H, kv_len)``, the keys the mask and lengths keep.
      mask_ok: bool ``(B,)`` for a traced mask, whether each example's mask is a padding
        mask (``lift`` makes the outputs of failing examples NaN); None otherwise.
      landmark_valid: bool ``(B, H, q_len)``, the queries that may enter query landmarks
        (see :func:`spectral_jax.attention.core._padding.landmark_query_valid`).
    """

    scale: Any
    query_valid: Array
    key_valid: Array
    mask_ok: Array | None
    landmark_valid: Array


def prologue(
    method: str, query: Array, key: Array, mask: Array | None, scale: Any, *,
    query_seq_lengths: Array | None, key_value_seq_lengths: Array | None,
    is_causal: bool = False, bottom_right: bool = False,
) -> Prologue:
    """The scale, then the mask reduced to query and key padding (checked to be one; for a
    causal call, on the causal triangle only, placed by ``bottom_right``).

    Raises:
      spectral_jax.UsageError: ``scale`` not positive, a mask or length array of the wrong
        shape, or a concrete mask that is not a padding mask.
    """
    scale = _common.default_scale(method, scale, query.shape[-1])
    shard = _seq.active()
    if shard is not None:
        # One shard of a sequence split over devices: the padding was reduced from the
        # global mask and lengths before the split (a mask row spans every shard).
        return Prologue(scale, *shard.padding)
    query_valid, key_valid, mask_ok = padding_from_mask(
        method, mask, query, key, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, with_check=True,
        causal_offset=(key.shape[-3] - query.shape[-3] if bottom_right else 0) if is_causal
        else None)
    landmark_valid = landmark_query_valid(query_valid, key_valid, mask, query_seq_lengths)
    return Prologue(scale, query_valid, key_valid, mask_ok, landmark_valid)


def slice_keys(method: str, rng: Array | None, query_valid: Array) -> tuple[Array, ...]:
    """``(keys,)``, one ``jax.random`` key per (example, head) of ``query_valid``'s
    ``(B, H, ...)``, folded in from ``rng``; ``()`` for ``rng=None`` (the deterministic
    form). Extra operands for :func:`spectral_jax.attention.core._common.lift`.

    Raises:
      spectral_jax.UsageTypeError: ``rng`` is not one PRNG key.
    """
    if rng is None:
        return ()
    _common.check_single_key(method, "rng", rng)
    b, h = query_valid.shape[:2]
    return (_common.fold_in_rng(rng, b, h, first=_seq.batch_offset(b)),)
