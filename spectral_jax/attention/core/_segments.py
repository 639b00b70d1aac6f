"""Segment ids: packed sequences, where a query attends only to keys of its own segment.

Several documents packed into one row (the way to train without padding) carry an int id
per token; query i may attend to key j only where ``query_segment_ids[i] ==
kv_segment_ids[j]``, as Flax builds the mask (``make_attention_mask(ids, ids, jnp.equal)``)
and as MaxText and fla pack. ``segment_ids`` is the one array of self-attention, for both.

The exact methods (softmax, local) apply that mask as it is. Methods that carry a running
state (linear, performer, and the recurrent family) reset it where the id changes, which is
the same thing when each id occupies one contiguous run of the row, the layout a packer
writes: they check that (:func:`contiguous`) and refuse ids that come back after another.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention.core import _hints, _seq

Array = jax.Array

KEYWORDS = ("segment_ids", "query_segment_ids", "kv_segment_ids")


class Segments(NamedTuple):
    """Checked ids, batch flattened: query ``(B, q_len)`` and key ``(B, kv_len)`` int32."""

    query: Array
    key: Array


def _check_ids(method: str, name: str, ids: Any, batch_shape: tuple[int, ...],
               length: int) -> Array:
    shape = (*batch_shape, length)
    if (not hasattr(ids, "shape") or tuple(ids.shape) != shape
            or not jnp.issubdtype(ids.dtype, jnp.integer)):
        raise UsageError(
            f"{method}(): `{name}` must be an int array of shape (batch..., length) = {shape}; "
            f"got {getattr(ids, 'dtype', type(ids).__name__)} {getattr(ids, 'shape', ids)!r}.")
    return jnp.asarray(ids, jnp.int32).reshape(math.prod(batch_shape), length)


def resolve(method: str, query: Array, key: Array, segment_ids: Any = None,
            query_segment_ids: Any = None, kv_segment_ids: Any = None, *,
            split_ok: bool = False) -> Segments | None:
    """The checked segment ids of one call, or None when none is given.

    ``split_ok``: the method honours ``segment_ids`` on a split sequence too (the registry
    lists them in its ``token_arrays``, so each shard gets its tokens' ids).

    Raises:
      spectral_jax.UsageError: ``segment_ids`` together with either of the other two, one
        of ``query_segment_ids`` / ``kv_segment_ids`` without the other, ``segment_ids`` with
        q_len != kv_len, ids not int or not of shape (batch..., length).
      spectral_jax.UnsupportedError: segment ids on a sequence split over devices, unless
        ``split_ok`` and given as ``segment_ids``.
    """
    if segment_ids is None and query_segment_ids is None and kv_segment_ids is None:
        return None
    if segment_ids is not None and (query_segment_ids is not None
                                    or kv_segment_ids is not None):
        raise UsageError(f"{method}(): give either `segment_ids` (self-attention) or "
                         "`query_segment_ids` and `kv_segment_ids`, not both.")
    if segment_ids is None and (query_segment_ids is None or kv_segment_ids is None):
        missing = "kv_segment_ids" if kv_segment_ids is None else "query_segment_ids"
        raise UsageError(f"{method}(): `query_segment_ids` and `kv_segment_ids` go together; "
                         f"`{missing}` is None.")
    q_len, kv_len = query.shape[-3], key.shape[-3]
    if segment_ids is not None:
        if q_len != kv_len:
            raise UsageError(
                f"{method}(): `segment_ids` is for self-attention (q_len == kv_len); got "
                f"q_len={q_len}, kv_len={kv_len}: pass query_segment_ids and kv_segment_ids.")
        query_segment_ids = kv_segment_ids = segment_ids
    if _seq.active() is not None and split_ok and segment_ids is None:
        raise UnsupportedError(
            f"{method}(): on a sequence split over devices segment ids are split with the "
            "tokens: pass `segment_ids` (self-attention), not query_segment_ids and "
            "kv_segment_ids.")
    if _seq.active() is not None and not split_ok:
        raise UnsupportedError(
            f"{method}(): segment ids on a sequence split over devices are not implemented "
            f"here; functions that take `segment_ids` there: "
            f"{_hints.functions_splitting('segment_ids')}.")
    batch_shape = query.shape[:-3]
    return Segments(
        _check_ids(method, "query_segment_ids" if segment_ids is None else "segment_ids",
                   query_segment_ids, batch_shape, q_len),
        _check_ids(method, "kv_segment_ids" if segment_ids is None else "segment_ids",
                   kv_segment_ids, batch_shape, kv_len))


def mask(segments: Segments, batch_shape: tuple[int, ...]) -> Array:
    """bool ``(batch..., 1, q_len, kv_len)``: query and key share a segment."""
    same = segments.query[:, :, None] == segments.key[:, None, :]
    return same.reshape(*batch_shape, 1, *same.shape[1:])


def contiguous(ids: Array, xp: Any = jnp) -> Array:
    """bool ``(B,)``: every id of the row occupies one contiguous run (``(B, n)`` ids;
    ``xp``: ``jnp``, or ``np`` for concrete ids inside a traced function)."""
    runs = 1 + xp.sum(ids[:, 1:] != ids[:, :-1], axis=1)
    ordered = xp.sort(ids, axis=1)
    distinct = 1 + xp.sum(ordered[:, 1:] != ordered[:, :-1], axis=1)
    return runs == distinct


def check_runs(method: str, segments: Segments) -> Array | None:
    """For methods that reset a running state where the id changes: the self-attention
    ids (query and key ids equal) must be contiguous runs.

    Returns:
      None when the check passed on concrete ids; traced, bool ``(B,)``, False for the
      examples whose ids come back after another (their outputs are to be made NaN).

    Raises:
      spectral_jax.UsageError: different query and key ids (this form is self-attention),
        or concrete ids that come back after another id.
    """
    if segments.query.shape != segments.key.shape or (
            _concrete(segments) and not np.array_equal(segments.query, segments.key)):
        raise UsageError(
            f"{method}(): segment ids reset a running state here, so queries and keys must "
            "share them (self-attention: pass `segment_ids`).")
    if not _concrete(segments):
        return contiguous(segments.key) & jnp.all(segments.query == segments.key, axis=1)
    ok = contiguous(np.asarray(segments.key), np)
    if not bool(np.all(ok)):
        raise UsageError(
            f"{method}(): examples {np.flatnonzero(~np.asarray(ok)).tolist()} have a segment id "
            "that comes back after another id; here a segment is a contiguous run (packed "
            "documents, padding with its own id). Give each run its own id.")
    return None


def with_runs_checked(method: str, segments: Segments, mask_ok: Array | None) -> Array | None:
    """``mask_ok`` (bool ``(B,)`` or None) also False for the examples whose traced ids are
    not contiguous runs; concrete ids that are not runs raise (:func:`check_runs`)."""
    runs_ok = check_runs(method, segments)
    if runs_ok is None:
        return mask_ok
    return runs_ok if mask_ok is None else mask_ok & runs_ok


def for_running_state(method: str, query: Array, key: Array, given: tuple[Any, Any, Any],
                      mask_ok: Array | None) -> tuple[tuple[Array, ...], Array | None]:
    """The lift arguments of a method that resets a running state: ``((B, H, n) ids,)`` or
    ``()``, and ``mask_ok`` with traced ids that are not runs made False (NaN outputs)."""
    segments = resolve(method, query, key, *given, split_ok=True)
    if segments is None:
        return (), mask_ok
    mask_ok = with_runs_checked(method, segments, mask_ok)
    ids = segments.key[:, None, :]
    return (jnp.broadcast_to(ids, (ids.shape[0], query.shape[-2], ids.shape[-1])),), mask_ok


def _concrete(segments: Segments) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in segments)


def positions(segment_ids: Array) -> Array:
    """int32 ``(batch..., n)``: each token's index in its run of equal ids (positions that
    restart per packed document, for position embeddings and RoPE).

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import segment_positions
      >>> segment_positions(jnp.array([[1, 1, 1, 2, 2, 0]])).tolist()
      [[0, 1, 2, 0, 1, 0]]
    """
    index = jnp.broadcast_to(jnp.arange(segment_ids.shape[-1]), segment_ids.shape)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[..., :1], bool),
                              segment_ids[..., 1:] != segment_ids[..., :-1]], axis=-1)
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=segment_ids.ndim - 1)
    return (index - first).astype(jnp.int32)


def refuse(method: str, given: dict[str, Any]) -> None:
    """Raises for segment ids passed to a method that cannot honour them.

    Raises:
      spectral_jax.UnsupportedError: naming the functions that take segment ids.
    """
    passed = [name for name in KEYWORDS if given.get(name) is not None]
    if passed:
        raise UnsupportedError(
            f"{method}(): `{passed[0]}` given, but this method does not keep packed segments "
            f"apart (segment ids are not implemented for it). Functions that take segment "
            f"ids: {_hints.functions_declaring('segment_ids')}; of those, "
            f"{_hints.functions_declaring('query_segment_ids')} also take query_segment_ids "
            "and kv_segment_ids.")
