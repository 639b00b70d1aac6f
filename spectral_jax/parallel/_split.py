"""Models on a split sequence: a context in which every attention layer shards the sequence."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from jax.sharding import AxisType, Mesh

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.attention._registry import AttentionSpec, get_attention_spec
from spectral_jax.parallel._sequence import sequence_parallel


class _Split(NamedTuple):
    mesh: Mesh
    axis_name: str
    batch_axis: str | None


_ACTIVE: contextvars.ContextVar[_Split | None] = contextvars.ContextVar(
    "spectral_jax_split_sequence", default=None)


@contextlib.contextmanager
def split_sequence(mesh: Mesh, *, axis_name: str = "seq",
                   batch_axis: str | None = None) -> Iterator[None]:
    """Inside, every :class:`spectral_jax.nn.MultiHeadAttention` shards its attention call.

    While a model is traced in this context, each attention layer calls
    :func:`sequence_parallel` with ``mesh``, ``axis_name`` and ``batch_axis`` instead of the
    plain method, so a whole Flax model (``TransformerEncoder``, ``SequenceClassifier``,
    ``DualEncoderClassifier``, ``CausalLM``) runs on a sequence split over devices. The
    layers around attention are per token (projections, MLPs, norms) or global reductions
    (pooling, losses): under ``jax.jit`` on the same mesh XLA partitions those, and the
    positions stay global. Values and gradients equal the unsplit model's, up to float32
    rounding. The context is read when the model is traced: enter it around the traced
    function's body (or around the first call of a jitted one).

    Args:
      mesh: a ``jax.sharding.Mesh`` with an axis ``axis_name``, its axes ``AxisType.Auto``
        (as the trainer's mesh), so that XLA partitions the layers around attention (with
        ``Explicit`` axes every layer would need its own sharding annotations). The
        model's sequence, with any token it adds (the CLS token of ``pooling="cls"``), must
        be a multiple of the axis size.
      axis_name: the mesh axis the sequence is split over.
      batch_axis: a mesh axis the batch is split over at the same time, or None.

    Raises:
      spectral_jax.UsageError: a mesh without the axes (the message names those it has), or
        with Explicit axes.
      spectral_jax.UsageTypeError: ``mesh`` not a ``jax.sharding.Mesh``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from spectral_jax.nn import MultiHeadAttention
      >>> from spectral_jax.parallel import split_sequence
      >>> layer = MultiHeadAttention(2, 8, attention="linear", rngs=nnx.Rngs(0))
      >>> x = jax.random.normal(jax.random.key(1), (2, 64, 8))
      >>> mesh = jax.make_mesh((4,), ("seq",), devices=jax.devices()[:4],
      ...                      axis_types=(jax.sharding.AxisType.Auto,))
      >>> def apply(x):
      ...     with split_sequence(mesh):
      ...         return layer(x)
      >>> bool(jnp.allclose(jax.jit(apply)(x), layer(x), atol=1e-5))
      True
    """
    if not isinstance(mesh, Mesh):
        raise UsageTypeError(f"split_sequence(): `mesh` must be a jax.sharding.Mesh; got "
                             f"{type(mesh).__name__}.")
    for name, axis in (("axis_name", axis_name), ("batch_axis", batch_axis)):
        if axis is not None and axis not in mesh.axis_names:
            raise UsageError(f"split_sequence(): `{name}`={axis!r} is not an axis of the "
                             f"mesh; its axes are {tuple(mesh.axis_names)}.")
    if any(t == AxisType.Explicit for t in mesh.axis_types):
        raise UsageError(
            f"split_sequence(): the mesh's axes must be AxisType.Auto, so that XLA "
            f"partitions the layers around attention; got axis types "
            f"{tuple(t.name for t in mesh.axis_types)} (jax.make_mesh's default is Explicit: "
            f"pass axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axis_names)}).")
    token = _ACTIVE.set(_Split(mesh, axis_name, batch_axis))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def attention_function(method: str | AttentionSpec) -> Callable[..., Any]:
    """The function an attention layer calls for ``method``: the registered one, or its
    :func:`sequence_parallel` form inside :func:`split_sequence`."""
    split = _ACTIVE.get()
    if split is None:
        return get_attention_spec(method).fn
    return sequence_parallel(method, mesh=split.mesh, axis_name=split.axis_name,
                             batch_axis=split.batch_axis)
