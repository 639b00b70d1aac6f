"""Pieces every attention method shares: the default scale, per-head lifting (and, from
the files below, the call checks and drop-in keywords).

Each method's math is written once for a single head on ``(length, head_dim)`` arrays and
lifted here with ``jax.vmap`` over heads and batch, so the per-head code never sees a layout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, _checks

# The call checks and the drop-in keywords live in their own files; every method reaches them
# through this floor.
from spectral_jax.attention.core._call_checks import (  # noqa: F401
    check_call,
    check_qkv,
    check_single_key,
    fold_grouped_values,
    reject_bias,
    reject_cache_query,
    reject_causal,
)
from spectral_jax.attention.core._kwargs import (  # noqa: F401
    FLAX_KWARGS,
    JAX_NN_KWARGS,
    check_flax_kwargs,
    drop_in_signature,
)

Array = jax.Array

def compute_dtype(dtype: Any) -> Any:
    """float32 or wider: softmax, normalisers and sequence reductions accumulate here."""
    return jnp.promote_types(dtype, jnp.float32)


def default_scale(method: str, scale: Any, head_dim: int) -> Any:
    """``1/sqrt(head_dim)`` for None; a positive number or scalar array otherwise.

    A traced scalar (e.g. a learned temperature) is passed through unchecked.
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, jax.core.Tracer) and jnp.ndim(scale) == 0:
        return scale
    try:
        value = float(scale)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(scale, bool) or jnp.ndim(scale) != 0 or not value > 0:
        raise UsageError(f"{method}(): `scale` must be a positive float or None; got {scale!r}.")
    return value


# On CPU a chunk of (example, head) slices covers about this many tokens: enough work per
# step to amortise the loop, few enough that one chunk's kernels stay in cache
# (benchmarks/attention_cpu_measurements.md).
CPU_TOKENS_PER_STEP = 4096


def resolve_head_chunk_size(
    method: str, head_chunk_size: Any, num_slices: int, length: int, *,
    platform: str | None = None,
) -> int:
    """How many (example, head) slices :func:`lift` computes at once on ``platform``.

    ``platform``: a lowering platform (``"cpu"``, ``"cuda"``, ``"tpu"``, ...), None for
    ``jax.default_backend()``. ``head_chunk_size=None`` means all slices at once on GPU/TPU
    (any platform but ``"cpu"``). On CPU it means about ``CPU_TOKENS_PER_STEP``
    tokens' worth of slices per step (at least one), or all at once when that would leave
    two steps or fewer. Why: on CPU, long sequences run faster and with a fraction of the
    temporaries when each step's n x m kernels stay in cache, while short ones gain
    nothing from the loop and its rematerialisation (figures in
    ``benchmarks/attention_cpu_measurements.md``). Accelerators want the whole batch in one
    kernel.
    """
    _checks.positive_int(f"{method}()", "head_chunk_size", head_chunk_size, allow_none=True)
    if head_chunk_size is None:
        head_chunk_size = num_slices
        if (platform or jax.default_backend()) == "cpu":
            chunk = max(1, CPU_TOKENS_PER_STEP // length)
            head_chunk_size = num_slices if 2 * chunk >= num_slices else chunk
    return min(int(head_chunk_size), num_slices)


def lift(
    per_head: Callable[..., Array],
    query: Array,
    key: Array,
    value: Array,
    query_valid: Array,
    key_valid: Array,
    *per_head_args: Array,
    method: str,
    head_chunk_size: int | None,
    mask_ok: Array | None = None,
    key_args: tuple[Array, ...] = (),
) -> Array:
    """Applies ``per_head(q, k, v, q_valid, k_valid, *args, *key_args)`` to every batch
    element and head.

    ``query`` is ``(batch..., n, H, d)``; ``query_valid``/``key_valid`` are ``(B, H, len)`` with
    batch flattened. Each of ``per_head_args`` has leading dims ``(B, H)``; each of
    ``key_args`` ``(B, H_kv)``: per key/value head, like the keys (gates, compressed-slot
    positions), so that with grouped heads they are shared by the query group. With
    ``head_chunk_size`` resolved by :func:`resolve_head_chunk_size` to ``B * H``, the per-head
    function is vmapped with axis names ``"batch"`` and ``"heads"``; otherwise ``jax.lax.map`` runs
    ``head_chunk_size`` slices per step, each under ``jax.checkpoint``, so the backward pass
    keeps no per-slice residuals and memory stays at one chunk's kernels. ``mask_ok`` (bool
    ``(B,)``, from :func:`padding_from_mask`) makes the outputs of failing examples NaN.
    """
    if key.shape[-2] != query.shape[-2]:
        return _grouped_lift(per_head, query, key, value, query_valid, key_valid,
                             *per_head_args, method=method, head_chunk_size=head_chunk_size,
                             mask_ok=mask_ok, key_args=key_args)
    per_head_args = (*per_head_args, *key_args)
    batch_shape = query.shape[:-3]
    b = math.prod(batch_shape)
    heads = query.shape[-2]
    method_head = per_head

    def per_head(q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
                 *args: Array) -> Array:
        # A padded key's weight is zero, but 0 * inf is NaN: zero its value first, so that
        # inf or NaN in padding never reaches a valid output.
        v = jnp.where(k_valid[:, None], v, jnp.zeros_like(v))
        return method_head(q, k, v, q_valid, k_valid, *args)

    length = max(query.shape[-3], key.shape[-3])
    cpu_chunk = resolve_head_chunk_size(method, head_chunk_size, b * heads, length,
                                        platform="cpu")
    other_chunk = resolve_head_chunk_size(method, head_chunk_size, b * heads, length,
                                          platform="accelerator")
    q, k, v = (x.reshape(b, *x.shape[-3:]) for x in (query, key, value))
    operands = (q, k, v, query_valid, key_valid, *per_head_args)

    def all_at_once(*xs: Array) -> Array:
        over_heads = jax.vmap(
            per_head, in_axes=(1, 1, 1, 0, 0) + (0,) * len(per_head_args), out_axes=1,
            axis_name="heads",
        )
        return jax.vmap(over_heads, axis_name="batch")(*xs)

    def run(chunk: int) -> Callable[..., Array]:
        return all_at_once if chunk >= b * heads else functools.partial(
            _chunked, per_head, heads, chunk)

    if cpu_chunk == other_chunk:
        out = run(cpu_chunk)(*operands)
    else:
        # The CPU-only chunking is chosen when the program is lowered, not traced: an
        # exported (jax.export) or cross-platform program gets the loop only on CPU.
        out = jax.lax.platform_dependent(*operands, cpu=run(cpu_chunk),
                                         default=run(other_chunk))
    return _poison(out, mask_ok).reshape(*batch_shape, *out.shape[1:])


def _grouped_lift(per_head: Callable[..., Array], query: Array, key: Array, value: Array,
                  query_valid: Array, key_valid: Array, *per_head_args: Array, method: str,
                  head_chunk_size: int | None, mask_ok: Array | None,
                  key_args: tuple[Array, ...]) -> Array:
    """:func:`lift` for G query heads per key/value head (query heads h·G .. h·G + G − 1
    share key/value head h, as ``jax.nn.dot_product_attention`` groups them).

    The G queries of a group are vmapped with the key, value and key validity unbatched, so
    everything the method computes from keys alone (landmarks, features, projections,
    states) is computed once per key/value head; ``per_head_args`` stay per query head,
    ``key_args`` go with the keys. A
    mask whose key padding differs inside a group cannot be shared: it raises when concrete
    and, traced, makes that example's outputs NaN like any mask that is not padding.
    """
    batch_shape = query.shape[:-3]
    b = math.prod(batch_shape)
    heads, kv_heads = query.shape[-2], key.shape[-2]
    groups = heads // kv_heads
    kv_valid, mask_ok = key_head_valid(method, key_valid, kv_heads, mask_ok)
    n, d = query.shape[-3], query.shape[-1]

    num_args = len(per_head_args)

    def group(q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array,
              *args: Array) -> Array:
        # One key/value head's query group, flattened into lift's one-head layout: q
        # (n, G·d), q_valid (G·n), args (G, ...), key_args unbatched; out (n, G·d_v).
        in_axes = (1, None, None, 0, None) + (0,) * num_args + (None,) * len(key_args)
        out = jax.vmap(per_head, in_axes=in_axes, out_axes=1)(
            q.reshape(n, groups, d), k, v, q_valid.reshape(groups, n), k_valid, *args)
        return out.reshape(n, -1)

    q = query.reshape(*batch_shape, n, kv_heads, groups * d)
    q_valid = query_valid.reshape(b, kv_heads, groups * n)
    args = tuple(a.reshape(b, kv_heads, groups, *a.shape[2:]) for a in per_head_args)
    out = lift(group, q, key, value, q_valid, kv_valid, *args, *key_args,
               method=method, head_chunk_size=head_chunk_size, mask_ok=mask_ok)
    # (batch..., n, H_kv, G·d_v) -> (batch..., n, H_q, d_v)
    return out.reshape(*batch_shape, n, heads, -1)


def key_head_valid(method: str, key_valid: Array, kv_heads: int,
                   mask_ok: Array | None) -> tuple[Array, Array | None]:
    """The key validity ``(B, H, n)`` of the query heads as ``(B, H_kv, n)``, one row per
    key/value head, and ``mask_ok`` updated: the query heads of one group must share their
    key padding (concrete: UsageError; traced: that example's ``mask_ok`` turns False)."""
    b, heads = key_valid.shape[:2]
    groups = heads // kv_heads
    grouped_valid = key_valid.reshape(b, kv_heads, groups, -1)
    shared = jnp.all(grouped_valid == grouped_valid[:, :, :1], axis=(1, 2, 3))
    if not isinstance(shared, jax.core.Tracer):
        if not bool(jnp.all(shared)):
            raise UsageError(
                f"{method}(): with grouped-query heads the key padding must be the same for "
                f"the {groups} query heads that share a key/value head; the mask differs "
                "inside a group. Pass a mask with one head (batch, 1, q_len, kv_len).")
    else:
        mask_ok = shared if mask_ok is None else mask_ok & shared
    return grouped_valid[:, :, 0], mask_ok


def _chunked(per_head: Callable[..., Array], heads: int, head_chunk_size: int, q: Array,
             k: Array, v: Array, query_valid: Array, key_valid: Array,
             *per_head_args: Array) -> Array:
    """``per_head`` over every (example, head) slice, ``head_chunk_size`` slices per
    ``jax.lax.map`` step, each step rematerialised; ``(B, n, H, d)`` out."""
    b = q.shape[0]

    def one_slice(index: Array) -> Array:
        # Slicing the (B, n, H, d) inputs inside the step, rather than mapping over
        # transposed copies, keeps q, k, v themselves as the only saved inputs.
        i, h = index // heads, index % heads

        def take(x: Array, head_axis: int) -> Array:
            x = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
            return jax.lax.dynamic_index_in_dim(x, h, head_axis - 1, keepdims=False)

        return per_head(take(q, 2), take(k, 2), take(v, 2), take(query_valid, 1),
                        take(key_valid, 1), *(take(a, 1) for a in per_head_args))

    out = jax.lax.map(jax.checkpoint(one_slice), jnp.arange(b * heads),
                      batch_size=head_chunk_size if head_chunk_size > 1 else None)
    return out.reshape(b, heads, *out.shape[1:]).swapaxes(1, 2)


def _poison(out: Array, mask_ok: Array | None) -> Array:
    """NaN for every output of an example whose traced mask was not a padding mask."""
    if mask_ok is None:
        return out
    return jnp.where(mask_ok.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.nan)


def poison_invalid(out: Array, mask_ok: Array | None) -> Array:
    """``out`` ``(batch..., n, heads, d)`` with NaN for each example whose traced mask was not
    a padding mask (``mask_ok`` from :func:`padding_from_mask` with ``with_check=True``), for
    methods that do not end in one :func:`lift`."""
    if mask_ok is None:
        return out
    ok = mask_ok.reshape(out.shape[:-3])[..., None, None, None]
    return jnp.where(ok, out, jnp.nan)


def masked_softmax(logits: Array, valid: Array, axis: int = -1) -> Array:
    """Softmax over ``valid`` entries only; rows with no valid entry give zeros (not NaN).

    ``jax.nn.softmax(where=...)`` has a custom derivative that keeps only its output for the
    backward pass, so an (n, m) kernel costs one saved array, not four.
    """
    return jax.nn.softmax(logits, axis=axis, where=valid)


def fold_in_rng(rng: Array, num_batch: int, num_heads: int, first: Any = 0) -> Array:
    """One key per (batch element, head), independent of how many others share the call.

    ``fold_in`` by index (rather than ``split`` by count) keeps example 0's key the same when
    more examples join the batch, so outputs never depend on batch composition. ``first``:
    the index of the first example (a shard of a batch split over devices).
    """
    index = jnp.arange(num_batch) + first
    batch_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, index)
    return jax.vmap(
        lambda key: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_heads))
    )(batch_keys)
