"""One sequence split over devices: any registered method under ``jax.shard_map``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax.attention._registry import AttentionSpec, get_attention_spec, methods_where
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._padding import landmark_query_valid, padding_from_mask

Array = jax.Array


def sequence_parallel(
    method: str | AttentionSpec, *, mesh: Mesh, axis_name: str = "seq",
    batch_axis: str | None = None, **method_kwargs: Any,
) -> Callable[..., Any]:
    """``method`` on a sequence split over the devices of ``mesh``'s ``axis_name``.

    The returned function has the method's call signature and takes globally shaped arrays
    ``(batch..., length, heads, head_dim)``; call it under ``jax.jit``. Inside, query, key and
    value are split along their length axis into ``mesh.shape[axis_name]`` contiguous
    shards (``jax.shard_map``), and every reduction over the sequence the method makes
    becomes a collective over that axis (:mod:`spectral_jax.attention.core._seq`): the outputs
    and gradients equal the single-device call's, up to float32 rounding. What crosses the
    devices is the registry entry's ``sequence_parallel`` form and ``communication`` formula
    (``spectral_jax.attention.SHARD_FORMS``): for the landmark methods O(m·d) numbers per
    head, independent of the length.

    Masks must be padding masks (or lengths); they are reduced to per-token validity on the
    global arrays before the split, so padding may cross shard boundaries and an example's
    valid tokens may all sit on one shard. A concrete mask that is not a padding mask
    raises; a traced one (under ``jax.jit``) cannot be checked there and makes that
    example's outputs NaN, as for the approximate methods on one device: pass
    ``is_causal=True`` rather than a causal mask, for softmax too.

    Args:
      method: a registered method name (``spectral_jax.attention.available_attentions()``),
        or its :class:`~spectral_jax.attention.AttentionSpec`.
      mesh: a ``jax.sharding.Mesh`` with an axis named ``axis_name``.
      axis_name: the mesh axis the sequence is split over.
      batch_axis: a mesh axis the leading batch dim is split over (data parallelism beside
        the sequence split), or None to replicate the batch over the other axes.
      **method_kwargs: keyword arguments of the method, fixed for every call (e.g.
        ``num_landmarks=64``); call-time keywords override them.

    Returns:
      ``fn(query, key, value, bias=None, mask=None, **kwargs)`` with the method's outputs.

    Raises:
      spectral_jax.UsageError: unknown method; a mesh without ``axis_name`` or
        ``batch_axis`` (the message names the axes it has); at call time a length or batch
        not divisible by the axis size (the message gives both), a ``bias``.
      spectral_jax.UnsupportedError: a method with no sharded form.
      spectral_jax.UsageTypeError: ``mesh`` not a ``jax.sharding.Mesh``.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import nystrom_attention
      >>> from spectral_jax.parallel import sequence_parallel
      >>> mesh = jax.make_mesh((4,), ("seq",), devices=jax.devices()[:4])
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> fn = jax.jit(sequence_parallel("nystrom", mesh=mesh, num_landmarks=16))
      >>> out = fn(q, k, v)
      >>> out.shape
      (2, 128, 4, 16)
      >>> bool(jax.numpy.allclose(out, nystrom_attention(q, k, v, num_landmarks=16),
      ...                         atol=1e-5))
      True
    """
    spec = get_attention_spec(method)
    if spec.sequence_parallel is None:
        sharded = methods_where(lambda other: other.sequence_parallel is not None)
        raise UnsupportedError(
            f"sequence_parallel(): {spec.name!r} has no sequence-sharded form; methods that "
            f"shard: {', '.join(sharded)}.")
    if not isinstance(mesh, Mesh):
        raise UsageTypeError(
            f"sequence_parallel(): `mesh` must be a jax.sharding.Mesh; got "
            f"{type(mesh).__name__}.")
    for name, axis in (("axis_name", axis_name), ("batch_axis", batch_axis)):
        if axis is not None and axis not in mesh.axis_names:
            raise UsageError(
                f"sequence_parallel(): `{name}`={axis!r} is not an axis of the mesh; its "
                f"axes are {tuple(mesh.axis_names)}.")
    if batch_axis == axis_name:
        raise UsageError(
            f"sequence_parallel(): `batch_axis` and `axis_name` must differ; both are "
            f"{axis_name!r}.")

    @functools.wraps(spec.fn)
    def call(query: Array, key: Array, value: Array, bias: Array | None = None,
             mask: Array | None = None, **kwargs: Any) -> Any:
        kwargs = {**method_kwargs, **kwargs}
        return _sharded_call(spec, mesh, axis_name, batch_axis, query, key, value, bias, mask,
                             kwargs)

    return call


def _sharded_call(spec: Any, mesh: Mesh, axis_name: str, batch_axis: str | None,
                  query: Array, key: Array, value: Array, bias: Array | None,
                  mask: Array | None, kwargs: dict[str, Any]) -> Any:
    name = f"sequence_parallel({spec.name!r})"
    if bias is not None:
        raise UsageError(f"{name}: `bias` cannot be split over the sequence (it is an n x n "
                         f"array); got shape {getattr(bias, 'shape', None)}.")
    method = spec.fn.__name__
    # Value heads may outnumber key heads (grouped values): the method checks the rest on
    # each shard; the split needs the lengths only.
    _common.check_qkv(method, query, key, value, grouped_ok=True, grouped_values_ok=True)
    shards = mesh.shape[axis_name]
    for arg, x in (("query", query), ("key", key)):
        if x.shape[-3] % shards:
            raise UsageError(
                f"{name}: the {arg} length {x.shape[-3]} is not divisible by the {shards} "
                f"devices of mesh axis {axis_name!r}; pad the sequence to a multiple of "
                f"{shards} (and mark the padding with a mask or lengths). In a model, the "
                f"length counts any token the model adds, such as the CLS token of "
                f"pooling='cls'.")
    if _checks.boolean(name, "is_causal", kwargs.get("is_causal", False)) and (
            query.shape[-3] != key.shape[-3]):
        raise UsageError(
            f"{name}: is_causal=True on a split sequence needs q_len == kv_len (each shard's "
            f"queries against the keys at the same positions); got q_len={query.shape[-3]}, "
            f"kv_len={key.shape[-3]}.")
    if batch_axis is not None and kwargs.get("pinv_init") == "global":
        raise UnsupportedError(
            f"{name}: pinv_init='global' takes one scale over the whole batch, which "
            f"batch_axis={batch_axis!r} splits; use pinv_init='per_matrix' or no batch_axis.")
    batch_shape = query.shape[:-3]
    if batch_axis is not None and (not batch_shape or batch_shape[0] % mesh.shape[batch_axis]):
        raise UsageError(
            f"{name}: the batch {batch_shape} is not divisible by the "
            f"{mesh.shape[batch_axis]} devices of mesh axis {batch_axis!r}.")
    q_len = kwargs.pop("query_seq_lengths", None)
    kv_len = kwargs.pop("key_value_seq_lengths", None)
    query_valid, key_valid, mask_ok = padding_from_mask(
        method, mask, query, key, query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
        with_check=True)
    landmark_valid = landmark_query_valid(query_valid, key_valid, mask, q_len)

    # Arrays (state, rng keys) travel as replicated operands; everything else is a static
    # keyword of the method.
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, (jax.Array, np.ndarray))}
    static = {k: v for k, v in kwargs.items() if k not in arrays}
    lead = (batch_axis,) + (None,) * (len(batch_shape) - 1) if batch_shape else ()
    token = P(*lead, axis_name, None, None)
    valid = P(batch_axis, None, axis_name)
    ok_spec = P(batch_axis)

    # Per-example arrays (a carried summary of shape (batch..., l, heads, d)) follow the
    # batch split; arrays with an entry per key position (the registry's token_arrays) are
    # cut to the keys' length and split with them; the rest are replicated.
    example = P(*lead, None, None, None)
    arg_specs = {k: example if x.ndim == query.ndim and x.shape[:-3] == batch_shape else P()
                 for k, x in arrays.items()}
    for arg, axis, batched in spec.token_arrays:
        if arg in arrays:
            x = arrays[arg]
            if x.ndim < -axis or x.shape[axis] < key.shape[-3]:
                raise UsageError(
                    f"{name}: `{arg}` must have an entry per key position along axis {axis} "
                    f"(at least {key.shape[-3]}); got shape {x.shape}.")
            arrays[arg] = jax.lax.slice_in_dim(x, 0, key.shape[-3], axis=axis)
            dims: list[str | None] = [None] * x.ndim
            dims[axis] = axis_name
            # A leading batch dim (not one broadcast over the batch) splits with the batch.
            if batched and x.ndim + axis > 0 and x.shape[0] == batch_shape[0] > 1:
                dims[0] = batch_axis
            arg_specs[arg] = P(*dims)
    carry = spec.carry is not None and bool(static.get(spec.carry[1]))

    def body(q, k, v, q_ok, k_ok, lm_ok, ok, arrays):
        shard = _seq.SeqShard(axis_name, shards, (q_ok, k_ok, ok, lm_ok), batch_axis)
        with _seq.sharded(shard):
            return spec.fn(q, k, v, **static, **arrays)

    operands = (query, key, value, query_valid, key_valid, landmark_valid, mask_ok, arrays)
    in_specs = (token, token, token, valid, valid, valid,
                None if mask_ok is None else ok_spec, arg_specs)
    if any(t == AxisType.Explicit for t in mesh.axis_types):
        # Arrays typed with an explicit sharding must arrive in the split they are mapped
        # with (``jax.make_mesh`` gives explicit axes by default).
        operands = jax.tree.map(
            lambda x, s: None if x is None else jax.reshard(x, NamedSharding(mesh, s)),
            operands, in_specs, is_leaf=lambda x: x is None)
    # A carried summary (Luna's P') is returned whole by every shard of the sequence.
    out_specs = (token, example) if carry else token
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    return mapped(*operands)
