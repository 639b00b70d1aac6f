"""One decoding step (:func:`decode_step`) and the check of a state decoded under jit.

See :mod:`spectral_jax.attention._decode` for the states and the refusal rules.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.attention._decode import (
    DecodeState,
    decode_form,
    finite_rows,
    flat_batch,
    flat_token_arrays,
    fold_values,
    is_concrete,
    method_params,
    state_arguments,
    token_arrays_of,
)
from spectral_jax.attention.core import _common, _segments

Array = jax.Array


def _check_state(caller: str, state: Any, query: Array, key: Array, value: Array) -> None:
    if not isinstance(state, DecodeState):
        raise UsageTypeError(f"{caller}: `state` must be a DecodeState (from prefill or "
                             f"init_decode_state); got {type(state).__name__}.")
    spec, form = decode_form(state.method, caller)
    _common.check_qkv(caller.removesuffix("()"), query, key, value, grouped_ok=form.grouped,
                      grouped_values_ok=spec.grouped_values)
    batch_shape = state.position.shape
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.shape[-3] != 1:
            raise UsageError(f"{caller}: one token per step: `{name}` must be (batch..., 1, "
                             f"heads, head_dim); got shape {x.shape}.")
    some = next(iter(state.arrays.values()))
    heads = some.shape[len(batch_shape)]
    expected = (*batch_shape, 1, heads)
    # The state's heads are the value heads (the key heads, or more with grouped values).
    if value.shape[:-1] != expected:
        raise UsageError(
            f"{caller}: the state was built for batch {batch_shape} and {heads} key/value "
            f"heads; got value of shape {value.shape} (batch {value.shape[:-3]}, "
            f"{value.shape[-2]} heads).")


def decode_step(
    state: DecodeState, query: Array, key: Array, value: Array, *,
    valid: Array | None = None, **kwargs: Any,
) -> tuple[Array, DecodeState]:
    """One token's causal output from the decoding state, and the state with the token in it.

    Equals the token's row of the method's parallel causal form over the whole sequence
    (prompt and steps; memory_compressed: over any longer sequence, see its decode form).

    Args:
      state: from :func:`prefill` or :func:`init_decode_state`.
      query, key, value: float ``(batch..., 1, heads, head_dim)`` (value: ``v_head_dim``):
        the new token at each example's ``state.position``; key and value with the state's
        heads, the query with as many or (grouped-query heads, where :func:`prefill` allows
        them) a multiple.
      valid: bool ``(batch...)``: False for a padding token (left padding, or a finished
        example): it is not written, the position does not advance and its output is zeros.
        None: all valid.
      **kwargs: the method's parameters, the same as for :func:`prefill` (``gates`` is the
        token's ``(batch..., 1, heads)``).

    Returns:
      ``(out (batch..., 1, heads, v_head_dim) in query's dtype, next state)``.

    Raises:
      spectral_jax.UsageError: the state's batch or head shape differs from the query's,
        more than one token, a missing state argument, a window or kernel other than the
        state's; with concrete inputs also a valid token past ``max_length`` or with a
        non-finite key, value or gate (under jit: see the module docstring).
      spectral_jax.UsageTypeError: not a DecodeState, unknown keywords.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import prefill, decode_step, softmax_attention
      >>> x = jax.random.normal(jax.random.key(0), (1, 6, 2, 4))
      >>> _, state = prefill("softmax", x[:, :5], x[:, :5], x[:, :5], max_length=8)
      >>> out, state = decode_step(state, x[:, 5:], x[:, 5:], x[:, 5:])
      >>> full = softmax_attention(x, x, x, is_causal=True)
      >>> bool(jnp.allclose(out, full[:, 5:], atol=1e-6)), int(state.position[0])
      (True, 6)
    """
    caller = "decode_step()"
    spec, form = decode_form(state.method, caller)
    value, unfold = fold_values(spec, form, caller, query, key, value)
    _check_state(caller, state, query, key, value)
    params = method_params(spec, caller, kwargs, required=state_arguments(spec, with_gates=True))
    segmented = [n for n in _segments.KEYWORDS if params.get(n) is not None]
    if segmented:
        raise UsageError(f"{caller}: `{segmented[0]}` given; a step is one token of the "
                         "segment the state holds (prefill resets at segment ids).")
    batch_shape = state.position.shape
    b = math.prod(batch_shape)
    valid = jnp.ones(batch_shape, bool) if valid is None else jnp.asarray(valid)
    if valid.shape != batch_shape or valid.dtype != jnp.bool_:
        raise UsageError(f"{caller}: `valid` must be a bool array of shape {batch_shape}; "
                         f"got {valid.dtype} {valid.shape}.")
    flat_params = flat_token_arrays(spec, params, key)
    q, k, v = (flat_batch(x, batch_shape)[:, 0] for x in (query, key, value))
    position, ok, want = (x.reshape(b) for x in (state.position, state.ok, valid))
    finite = finite_rows(want[:, None], k[:, None], v[:, None],
                         *token_arrays_of(spec, flat_params))
    full = want & (position >= state.max_length)
    if is_concrete(full, finite):
        if bool(np.any(full)):
            raise UsageError(
                f"{caller}: examples {np.flatnonzero(np.asarray(full)).tolist()} are at "
                f"position {state.max_length}: the cache holds max_length="
                f"{state.max_length} tokens; build it with a larger max_length.")
        if not bool(np.all(finite)):
            raise UsageError(
                f"{caller}: examples {np.flatnonzero(~np.asarray(finite)).tolist()} have a "
                "non-finite key, value or gate; it would enter the decoding state.")
    arrays = {n: flat_batch(a, batch_shape) for n, a in state.arrays.items()}
    next_ok = ok & ~full & finite
    write = want & next_ok
    step = (lambda *a: form.step(spec.fn, *a)) if form.uses_fn else form.step
    out, new = step(arrays, position, write, q, k, v, flat_params)
    arrays = {n: new[n].reshape(state.arrays[n].shape) for n in arrays}
    out = jnp.where(next_ok[:, None, None], out, jnp.nan)
    out = jnp.where(want[:, None, None], out, 0.0).astype(query.dtype)
    next_state = DecodeState(state.method, state.max_length,
                             (position + write).reshape(batch_shape).astype(jnp.int32),
                             next_ok.reshape(batch_shape), arrays)
    return unfold(out.reshape(*batch_shape, 1, *out.shape[1:])), next_state


def check_decode_state(state: DecodeState) -> DecodeState:
    """Raises if a token was refused under jit (``state.ok`` False somewhere); else ``state``.

    Raises:
      spectral_jax.UsageError: the examples whose token went past ``max_length`` or had a
        non-finite key, value or gate, or whose prompt length lay outside [0, P].

    Example:
      >>> from spectral_jax.attention import init_decode_state, check_decode_state
      >>> s = init_decode_state("linear", batch_shape=(2,), max_length=4, num_heads=1,
      ...                       head_dim=2)
      >>> check_decode_state(s) is s
      True
    """
    ok = np.asarray(state.ok)
    if not ok.all():
        raise UsageError(
            f"decode: examples {np.flatnonzero(~ok.reshape(-1)).tolist()} of the "
            f"{state.method!r} state had a token refused: past max_length={state.max_length} "
            "or with a non-finite key, value or gate, or a prompt length outside [0, P] in "
            "prefill; their outputs since are NaN.")
    return state
