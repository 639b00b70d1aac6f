"""Autoregressive decoding for every causal method: a prefill and a one-token step.

``prefill`` runs a prompt through a method's causal form and returns its outputs and the
decoding state; ``decode_step`` takes the state and one new query/key/value and returns that
token's output and the next state. Both are pure and jittable, and ``decode_step`` can be the
body of ``jax.lax.scan``. The state is each method's own, named by its registry entry's
``decode`` field (:data:`DECODE_FORMS`): a key/value cache (softmax), a ring buffer of
``window + 1`` positions (local), the running φ(K)ᵀV and Σφ(K) (linear, performer:
constant in the context length), the same decayed by gates (gated_linear), and the complete
memory slots plus the open one (memory_compressed).

Every example of a batch has its own position: prompts of different lengths are passed
right-padded with ``lengths``, and a step's ``valid`` marks tokens that are padding (left
padding, or an example that has finished), which neither enter the state nor advance it.

Nothing bad enters a state silently. A token past ``max_length`` or with a non-finite key,
value or gate is refused, and so is a prompt length outside [0, P]: with concrete inputs
(eager calls) ``prefill`` and ``decode_step`` raise; under ``jax.jit`` the token is not
written, the example's ``ok`` flag turns False and its outputs are NaN from then on;
:func:`check_decode_state` raises for such a state once it is concrete.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax.attention._registry import ATTENTIONS, AttentionSpec, get_attention_spec
from spectral_jax.attention.compressed._decode import COMPRESSED_MEMORY
from spectral_jax.attention.core import _common, _segments
from spectral_jax.attention.core._decode_form import DecodeForm
from spectral_jax.attention.exact._decode import KV_CACHE
from spectral_jax.attention.kernel._decode import (
    FEATURE_STATE,
    GATED_STATE,
    RANDOM_FEATURE_STATE,
)
from spectral_jax.attention.recurrent._decode import RECURRENT_STATE
from spectral_jax.attention.sparse._decode import RING_BUFFER

Array = jax.Array

# The decode forms, by the name a registry entry's ``decode`` field gives.
DECODE_FORMS: dict[str, DecodeForm] = {
    "kv_cache": KV_CACHE,
    "ring_buffer": RING_BUFFER,
    "feature_state": FEATURE_STATE,
    "random_feature_state": RANDOM_FEATURE_STATE,
    "gated_state": GATED_STATE,
    "compressed_memory": COMPRESSED_MEMORY,
    "recurrent_state": RECURRENT_STATE,
}

# fn parameters that decoding sets itself.
_OWN = frozenset({"query", "key", "value", "bias", "mask", "is_causal", "query_seq_lengths",
                  "key_value_seq_lengths"})


@dataclasses.dataclass(frozen=True)
class DecodeState:
    """The decoding state of one attention layer: a pytree (jit and scan carry it).

    Attributes:
      method: the registry name (static).
      max_length: tokens the state can hold per example (static).
      position: int32 ``(batch...)``: tokens written so far, the index of the next one.
      ok: bool ``(batch...)``: False once a token was refused (past ``max_length``, or a
        non-finite key, value or gate under jit) or a traced prompt length lay outside
        [0, P] (:func:`prefill`); that example's outputs are then NaN.
      arrays: the method's own ``(batch..., heads, ...)`` arrays (``DECODE_FORMS``), e.g.
        ``key``/``value`` ``(batch..., heads, max_length, head_dim)`` for softmax,
        ``state``/``norm`` ``(batch..., heads, r, v_head_dim)``/``(..., r)`` (float32) for
        linear and performer.
    """

    method: str
    max_length: int
    position: Array
    ok: Array
    arrays: dict[str, Array]

    @property
    def nbytes(self) -> int:
        """Bytes of the method's arrays (the cache or state, without position and ok)."""
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in self.arrays.values())


jax.tree_util.register_dataclass(DecodeState, data_fields=["position", "ok", "arrays"],
                                 meta_fields=["method", "max_length"])


def decode_methods() -> tuple[str, ...]:
    """The registered methods with a decode form (every method with a causal form).

    Example:
      >>> from spectral_jax.attention import decode_methods
      >>> decode_methods()[:3]
      ('softmax', 'linear', 'performer')
    """
    return tuple(n for n, s in ATTENTIONS.items() if s.decode is not None)


def decode_form(method: str | AttentionSpec,
                caller: str = "decode") -> tuple[AttentionSpec, DecodeForm]:
    """The registry entry of ``method`` and its decode form.

    Raises:
      spectral_jax.UsageError: unknown method.
      spectral_jax.UnsupportedError: the method has no causal form, hence no decode form;
        the message lists those that have one.
    """
    spec = get_attention_spec(method)
    if spec.decode is None:
        raise UnsupportedError(
            f"{caller}: attention={spec.name!r} has no causal form, so it cannot decode token "
            f"by token. Methods that decode: {', '.join(decode_methods())}.")
    return spec, DECODE_FORMS[spec.decode]


def method_params(spec: AttentionSpec, caller: str, given: dict[str, Any], *,
            required: tuple[str, ...]) -> dict[str, Any]:
    """The method's parameters: ``fn``'s defaults updated with ``given`` (checked)."""
    signature = inspect.signature(spec.fn).parameters
    allowed = {n: p for n, p in signature.items()
               if n not in _OWN and p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise UsageTypeError(
            f"{caller}: unknown keyword(s) {unknown} for attention={spec.name!r}; it takes "
            f"{sorted(allowed)}.")
    params = {n: (None if p.default is inspect.Parameter.empty else p.default)
              for n, p in allowed.items()}
    params.update(given)
    missing = [n for n in required if params.get(n) is None]
    if missing:
        raise UsageError(
            f"{caller}: attention={spec.name!r} needs {missing} (its state, e.g. from "
            f"AttentionSpec.make_state or the layer that owns it); got None.")
    return params


def state_arguments(spec: AttentionSpec, *, with_gates: bool) -> tuple[str, ...]:
    names = () if spec.state_kind is None else spec.state_kind.arguments
    return tuple(n for n in names if with_gates or n != "gates")


def init_decode_state(
    method: str | AttentionSpec, *, batch_shape: tuple[int, ...], max_length: int, num_heads: int,
    head_dim: int, v_head_dim: int | None = None, dtype: Any = jnp.float32, **kwargs: Any,
) -> DecodeState:
    """The empty decoding state of ``method`` (no token written), e.g. for a layer's cache.

    Args:
      method: a name from :func:`decode_methods`, or its :class:`AttentionSpec`.
      batch_shape: the batch dims of the queries to decode.
      max_length: tokens the state must hold per example (prompt and generated ones).
      num_heads, head_dim, v_head_dim: the key/value layout (``v_head_dim`` defaults to
        head_dim); with grouped-query heads the steps' queries have a multiple of num_heads.
      dtype: dtype of stored keys and values (running sums are float32).
      **kwargs: the method's parameters that size the state (``window``, ``projection``,
        ``key_conv``/``value_conv``/``stride``), as for :func:`decode_step`.

    Raises:
      spectral_jax.UnsupportedError: a method without a causal form.
      spectral_jax.UsageError: a bad size, or a missing state argument.

    Example:
      >>> from spectral_jax.attention import init_decode_state
      >>> s = init_decode_state("softmax", batch_shape=(2,), max_length=16, num_heads=4,
      ...                       head_dim=8)
      >>> s.arrays["key"].shape, int(s.position[0])
      ((2, 4, 16, 8), 0)
    """
    caller = "init_decode_state()"
    spec, form = decode_form(method, caller)
    max_length = _checks.positive_int(caller, "max_length", max_length)
    num_heads = _checks.positive_int(caller, "num_heads", num_heads)
    head_dim = _checks.positive_int(caller, "head_dim", head_dim)
    v_head_dim = head_dim if v_head_dim is None else _checks.positive_int(
        caller, "v_head_dim", v_head_dim)
    batch_shape = tuple(int(b) for b in batch_shape)
    # The recurrent family's state is sized by the layout alone: its gates come per token.
    required = () if form.uses_fn else state_arguments(spec, with_gates=False)
    params = method_params(spec, caller, kwargs, required=required)
    b = math.prod(batch_shape)
    arrays = form.init(b, num_heads, head_dim, v_head_dim, max_length, dtype, params)
    return DecodeState(
        spec.name, max_length, jnp.zeros(batch_shape, jnp.int32), jnp.ones(batch_shape, bool),
        {n: a.reshape(*batch_shape, *a.shape[1:]) for n, a in arrays.items()})


def flat_batch(x: Array, batch_shape: tuple[int, ...]) -> Array:
    return x.reshape(math.prod(batch_shape), *x.shape[len(batch_shape):])


def flat_token_arrays(spec: AttentionSpec, params: dict[str, Any],
                      key: Array) -> dict[str, Any]:
    """The per-token arguments (the registry entry's ``token_arrays``: RFA-Gate's gates, the
    recurrent family's g, β, Δ), their batch dims broadcast to key's and flattened to B."""
    batch_shape = key.shape[:-3]
    flat = dict(params)
    for name, axis, batched in spec.token_arrays:
        if not batched or params.get(name) is None:
            continue
        x = jnp.asarray(params[name])
        trailing = x.shape[x.ndim + axis:]
        flat[name] = jnp.broadcast_to(x, (*batch_shape, *trailing)).reshape(-1, *trailing)
    return flat


def token_arrays_of(spec: AttentionSpec, flat_params: dict[str, Any]) -> list[Array]:
    """The flattened per-token arguments present in ``flat_params``, for the finite check."""
    return [flat_params[n] for n, _, batched in spec.token_arrays
            if batched and flat_params.get(n) is not None]


def finite_rows(valid: Array, *xs: Array) -> Array:
    """bool ``(B,)``: every value of the ``valid`` rows of each ``(B, n, ...)`` x is finite."""
    ok = jnp.ones(valid.shape[0], bool)
    for x in xs:
        bad = ~jnp.isfinite(x).reshape(*x.shape[:2], -1).all(-1) & valid
        ok &= ~bad.any(-1)
    return ok


def is_concrete(*xs: Any) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(xs))


def prefill(
    method: str | AttentionSpec, query: Array, key: Array, value: Array, *, max_length: int,
    lengths: Array | None = None, **kwargs: Any,
) -> tuple[Array, DecodeState]:
    """The causal outputs of a prompt and the decoding state after it.

    Args:
      method: a name from :func:`decode_methods`, or its :class:`AttentionSpec`.
      query, key, value: float ``(batch..., P, heads, head_dim)`` (value: ``v_head_dim``),
        the prompts right-padded to one length P. Grouped-query heads (softmax, local,
        linear, performer): the query may have a multiple of the key/value heads; the state
        then holds the key/value heads only.
      max_length: tokens the state holds per example, P ≤ max_length.
      lengths: int ``(batch...)``: each prompt's length (≤ P; 0 allowed); None: all P.
      **kwargs: the method's parameters (as for its function: ``window``, ``feature_map``,
        ``projection``, ``gates`` ``(batch..., P, heads)``, ``key_conv``, ...).

    Returns:
      ``(out, state)``: out ``(batch..., P, heads, v_head_dim)`` in ``query``'s dtype, the
      method's causal form on each prompt (rows past its length are zeros); ``state`` with
      ``position == lengths`` (see below for a flagged example).

    Raises:
      spectral_jax.UnsupportedError: a method without a causal form (the message lists those
        with one).
      spectral_jax.UsageError: bad shapes, q_len != kv_len, a prompt longer than
        ``max_length``, a missing state argument, or (concrete inputs) lengths outside
        [0, P] or a non-finite key, value or gate in a prompt.

    Under ``jax.jit`` an example whose length lies outside [0, P] or whose prompt has a
    non-finite key, value or gate is flagged instead: its ``ok`` is False, its outputs
    (these and every later step's) are NaN, and its state is built from the length clipped
    to [0, P]; :func:`check_decode_state` raises for it once the state is concrete.

    Example:
      >>> import jax
      >>> from spectral_jax.attention import prefill, linear_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 5, 4, 8))
      >>> out, state = prefill("linear", q, k, v, max_length=32)
      >>> out.shape, state.arrays["state"].shape
      ((2, 5, 4, 8), (2, 4, 8, 8))
    """
    caller = "prefill()"
    spec, form = decode_form(method, caller)
    value, unfold = fold_values(spec, form, caller, query, key, value)
    _common.check_qkv(caller.removesuffix("()"), query, key, value, grouped_ok=form.grouped,
                      grouped_values_ok=spec.grouped_values)
    max_length = _checks.positive_int(caller, "max_length", max_length)
    batch_shape, p = query.shape[:-3], query.shape[-3]
    if key.shape[-3] != p:
        raise UsageError(f"{caller}: the prompt's queries and keys must have one length; got "
                         f"q_len={p} and kv_len={key.shape[-3]}.")
    if p > max_length:
        raise UsageError(f"{caller}: the prompt has {p} tokens, longer than the cache "
                         f"(max_length={max_length}).")
    if lengths is None:
        lengths = jnp.full(batch_shape, p, jnp.int32)
    lengths = jnp.asarray(lengths)
    if lengths.shape != batch_shape or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise UsageError(f"{caller}: `lengths` must be an int array of shape {batch_shape} "
                         f"(one per example); got {lengths.dtype} {lengths.shape}.")
    if is_concrete(lengths) and lengths.size and not (
            (np.asarray(lengths) >= 0) & (np.asarray(lengths) <= p)).all():
        raise UsageError(f"{caller}: `lengths` must lie in [0, {p}] (the prompt length); got "
                         f"{np.asarray(lengths).tolist()}.")
    params = method_params(spec, caller, kwargs, required=state_arguments(spec, with_gates=True))
    segmented = [n for n in _segments.KEYWORDS if params.get(n) is not None]
    if segmented and not form.uses_fn:
        raise UnsupportedError(
            f"{caller}: `{segmented[0]}` given, but the {spec.decode!r} state of "
            f"attention={spec.name!r} holds every prompt token, not one segment; prefill one "
            "document per example (the recurrent family's state resets at segment ids).")
    q, k, v = (flat_batch(x, batch_shape) for x in (query, key, value))
    # A traced length outside [0, P] would claim slots the prompt never wrote: the example
    # is flagged (ok False) and its state built from the length clipped into range.
    in_range = (lengths.reshape(-1) >= 0) & (lengths.reshape(-1) <= p)
    flat_lengths = jnp.clip(lengths.reshape(-1), 0, p).astype(jnp.int32)
    clipped = flat_lengths.reshape(batch_shape)
    flat_params = flat_token_arrays(spec, params, key)
    valid = jnp.arange(p)[None, :] < flat_lengths[:, None]
    finite = finite_rows(valid, k, v, *token_arrays_of(spec, flat_params))
    if is_concrete(finite) and not bool(np.all(finite)):
        raise UsageError(f"{caller}: examples {np.flatnonzero(~np.asarray(finite)).tolist()} "
                         "have a non-finite key, value or gate in their prompt; it would "
                         "enter the decoding state.")
    ok = (finite & in_range).reshape(batch_shape)
    if form.uses_fn:
        out, arrays = form.prefill(spec.fn, query, key, value, clipped, params)
        out = jnp.where(ok.reshape(*batch_shape, 1, 1, 1), out, jnp.nan)
        return out.astype(query.dtype), DecodeState(spec.name, max_length, clipped, ok, arrays)
    if form.outputs is not None:
        out = form.outputs(q, k, v, flat_lengths, flat_params)
        out = out.reshape(*batch_shape, *out.shape[1:])
    else:
        out = spec.fn(query, key, value, is_causal=True, query_seq_lengths=clipped,
                      key_value_seq_lengths=clipped, **kwargs)
    out = jnp.where(ok.reshape(*batch_shape, 1, 1, 1), out, jnp.nan)
    arrays = form.prefill(q, k, v, flat_lengths, max_length, flat_params)
    state = DecodeState(spec.name, max_length, clipped, ok,
                        {n: a.reshape(*batch_shape, *a.shape[1:]) for n, a in arrays.items()})
    return unfold(out.astype(query.dtype)), state


def fold_values(spec: Any, form: Any, caller: str, query: Array, key: Array,
                value: Array) -> tuple[Array, Any]:
    """Grouped values for a decode form that keeps sums over keys (linear, Performer, gated
    linear): each key head's state holds its G value heads side by side
    (:func:`~spectral_jax.attention.core._call_checks.fold_grouped_values`); the recurrent
    family's own form takes them as they are."""
    if spec.grouped_values and not form.uses_fn:
        return _common.fold_grouped_values(caller.removesuffix("()"), query, key, value)
    return value, lambda out: out

