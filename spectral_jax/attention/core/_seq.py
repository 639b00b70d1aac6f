"""Reductions over the sequence: plain on one device, collectives on a sharded sequence.

Every place where a method reduces over the sequence (segment sums and counts, a softmax
normaliser over keys, KᵀV, a prefix state, a top-k) calls one of these helpers. Outside
:func:`spectral_jax.parallel.sequence_parallel` no shard is active and each helper is the
identity (or the plain reduction), so the single-device programs are unchanged. Inside it,
the per-head code sees only its shard of the sequence and the helpers turn the local
reduction into the global one over the mesh axis (``psum``, ``pmax``, ``all_gather``), so
one per-head core serves both.

The active shard is set while the sharded function is traced (a context variable, read at
trace time), so the same Python function lowers to the plain program or to the sharded one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class SeqShard(NamedTuple):
    """The sequence shard being traced: its mesh axis and how many shards there are.

    Attributes:
      axis_name: the mesh axis the sequence is split over.
      num_shards: the size of that axis.
      padding: the call's padding, computed once on the global arrays and passed in as this
        shard's slices: ``(query_valid, key_valid, mask_ok, landmark_valid)`` as
        :func:`spectral_jax.attention.core._prologue.prologue` returns them.
      batch_axis: the mesh axis the leading batch dim is split over, or None.
    """

    axis_name: str
    num_shards: int
    padding: tuple[Array, Array, Array | None, Array]
    batch_axis: str | None = None


_ACTIVE: contextvars.ContextVar[SeqShard | None] = contextvars.ContextVar(
    "spectral_jax_seq_shard", default=None)


def active() -> SeqShard | None:
    """The shard being traced, or None on one device."""
    return _ACTIVE.get()


@contextlib.contextmanager
def sharded(shard: SeqShard) -> Iterator[SeqShard]:
    """Traces the enclosed calls as one shard of a sequence split over ``shard.axis_name``."""
    token = _ACTIVE.set(shard)
    try:
        yield shard
    finally:
        _ACTIVE.reset(token)


def num_shards() -> int:
    """How many shards the sequence is split into (1 on one device)."""
    shard = active()
    return 1 if shard is None else shard.num_shards


def global_length(local_length: int) -> int:
    """The whole sequence's length from one shard's (static)."""
    return local_length * num_shards()


def total(x: Any) -> Any:
    """``x`` summed over the shards (a pytree; ``x`` itself on one device)."""
    shard = active()
    return x if shard is None else jax.lax.psum(x, shard.axis_name)


def maximum(x: Array) -> Array:
    """``x``'s elementwise maximum over the shards, without a derivative (for stabilisers)."""
    shard = active()
    return x if shard is None else jax.lax.pmax(jax.lax.stop_gradient(x), shard.axis_name)


def exclusive_prefix(x: Any) -> Any:
    """The sum of ``x`` over the shards before this one (0 for the first; 0 on one device).

    One all-gather of ``x`` (per-shard totals: counts, states), then a masked sum: traffic
    ``num_shards · size(x)``, independent of the sequence length.
    """
    shard = active()
    if shard is None:
        return jax.tree.map(jnp.zeros_like, x)
    index = jax.lax.axis_index(shard.axis_name)
    before = jnp.arange(shard.num_shards) < index

    def prefix(leaf: Array) -> Array:
        every = jax.lax.all_gather(leaf, shard.axis_name)
        keep = before.reshape((-1,) + (1,) * leaf.ndim)
        return jnp.where(keep, every, jnp.zeros_like(every)).sum(0).astype(leaf.dtype)

    return jax.tree.map(prefix, x)


def batch_offset(local_batch: int) -> Array | int:
    """The global index of this shard's first example (0 unless the batch is split too)."""
    shard = active()
    if shard is None or shard.batch_axis is None:
        return 0
    return jax.lax.axis_index(shard.batch_axis) * local_batch


def varying(x: Array) -> Array:
    """``x``, a value every shard holds alike, marked as one that varies over the shards.

    Sharded, a replicated value that meets a shard's own data is cast to varying where it
    meets them, and the backward pass all-reduces its cotangent there: casting a scalar
    before it is broadcast over the shard's tokens keeps that all-reduce one number, not
    one per token. The identity on one device.
    """
    shard = active()
    return x if shard is None else jax.lax.pcast(x, (shard.axis_name,), to="varying")


def offset(local_length: int) -> Array | int:
    """The global position of this shard's first token (0 on one device)."""
    shard = active()
    return 0 if shard is None else jax.lax.axis_index(shard.axis_name) * local_length


def gather(x: Array, axis: int) -> Array:
    """Every shard's ``x`` concatenated along ``axis`` in shard order (``x`` on one device):
    ``num_shards · size(x)`` numbers, for summaries short enough to hold whole."""
    shard = active()
    return x if shard is None else jax.lax.all_gather(x, shard.axis_name, axis=axis, tiled=True)


def from_previous(x: Any) -> Any:
    """The previous shard's ``x`` (a pytree of equal shapes on every shard), by one
    ``ppermute``; zeros for the first shard, and on one device (there is no previous one).
    A halo: each shard sends ``size(x)`` numbers, whatever the sequence length."""
    shard = active()
    if shard is None:
        return jax.tree.map(jnp.zeros_like, x)
    ring = [(i, i + 1) for i in range(shard.num_shards - 1)]
    return jax.lax.ppermute(x, shard.axis_name, ring)


def from_next(x: Any) -> Any:
    """The next shard's ``x``; zeros for the last shard and on one device (see
    :func:`from_previous`)."""
    shard = active()
    if shard is None:
        return jax.tree.map(jnp.zeros_like, x)
    ring = [(i + 1, i) for i in range(shard.num_shards - 1)]
    return jax.lax.ppermute(x, shard.axis_name, ring)


def _held(index: Array, local_length: int) -> tuple[Array, Array]:
    """Global positions ``index`` as positions in this shard (clipped into it), and which
    of them this shard holds."""
    local = index - offset(local_length)
    held = (local >= 0) & (local < local_length)
    return jnp.clip(local, 0, local_length - 1), held


def take(x: Array, index: Array, axis: int = 0) -> Array:
    """``x``'s entries at global positions ``index`` along the sharded ``axis``, on every shard.

    On one device this is ``x[..., index, ...]``. Sharded, each shard contributes the
    positions it holds (zeros elsewhere) and one all-reduce of ``index.size`` slices gives
    every shard the whole selection: for a few sampled rows (landmarks, δ's diagonal
    sample) the traffic is independent of the sequence length.
    """
    if active() is None:
        return x[(slice(None),) * (axis % x.ndim) + (index,)]
    local, held = _held(index, x.shape[axis])
    picked = jnp.take(x, local, axis=axis)
    held = held.reshape(held.shape + (1,) * (x.ndim - 1 - axis % x.ndim))
    if picked.dtype == jnp.bool_:
        return total(jnp.where(held, picked, False).astype(jnp.int32)) > 0
    return total(jnp.where(held, picked, jnp.zeros_like(picked)))


def take_selected(x: Array, index: Array, select: Array) -> Array:
    """``x[index[select]]``, ``index`` global positions along ``x``'s sharded first axis and
    ``select`` a local pick of its rows (each query's cluster's top-k keys).

    On one device one gather, whose derivative sums straight into ``x``'s rows. Sharded,
    :func:`take` of the whole ``index`` (``index.size`` rows, one all-reduce), then the
    local pick: the traffic does not depend on how many local items pick.
    """
    if active() is None:
        return x[index[select]]
    return take(x, index)[select]


def take_entries(x: Array, index: Array) -> Array:
    """``x[i, index[i]]`` for each row i of ``x (rows, n)`` whose last axis is the sharded one."""
    rows = jnp.arange(index.shape[0])
    if active() is None:
        return x[rows, index]
    local, held = _held(index, x.shape[-1])
    return total(jnp.where(held, x[rows, local], 0.0))


def softmax(logits: Array, valid: Array, axis: int = -1) -> Array:
    """A softmax over ``valid`` entries whose ``axis`` is the sharded sequence.

    On one device this is ``jax.nn.softmax(logits, axis, where=valid)``. Sharded, it is a
    distributed log-sum-exp: the maximum and the sum of exponentials are reduced over the
    shards (traffic: two arrays of the non-sequence shape, e.g. m numbers each for m
    landmark queries). Rows with no valid entry anywhere give zeros.
    """
    shard = active()
    if shard is None:
        return jax.nn.softmax(logits, axis=axis, where=valid)
    masked = jnp.where(valid, logits, -jnp.inf)
    top = maximum(jnp.max(masked, axis=axis, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weights = jnp.where(valid, jnp.exp(logits - top), 0.0)
    norm = total(jnp.sum(weights, axis=axis, keepdims=True))
    return weights / jnp.where(norm > 0, norm, 1.0)


def top_k(x: Array, k: int) -> tuple[Array, Array]:
    """The ``k`` largest entries of ``x`` along its last axis, the sharded one, and their
    global positions.

    On one device this is ``jax.lax.top_k(x, k)``. Sharded, each shard's own top
    ``min(k, n_local)`` entries and their global positions are all-gathered in shard order
    (``2·P·min(k, n_local)`` numbers per row) and the top ``k`` of those are taken: the
    global top ``k`` lies among them, and since ``jax.lax.top_k`` puts equal values lower
    index first, equal values keep the lower global position first, as on one device.
    """
    shard = active()
    if shard is None:
        return jax.lax.top_k(x, k)
    n = x.shape[-1]
    values, index = jax.lax.top_k(x, min(k, n))
    every_value, every_index = jax.lax.all_gather(
        (values, index + offset(n)), shard.axis_name, axis=x.ndim - 1, tiled=True)
    values, pick = jax.lax.top_k(every_value, k)
    return values, jnp.take_along_axis(every_index, pick, axis=-1)


def local_index(index: Array, local_length: int) -> Array:
    """Global positions ``index`` as positions in this shard, with ``local_length`` (past the
    end) for those another shard holds: the indices of a scatter with ``mode="drop"``, by
    which each shard writes back only its own rows. ``index`` itself on one device."""
    if active() is None:
        return index
    local, held = _held(index, local_length)
    return jnp.where(held, local, local_length)

