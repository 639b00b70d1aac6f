"""Grouped-query heads in decoding: the state holds the key/value heads only, and prefill +
steps equal the grouped parallel causal run (and the run with repeated heads); forms without
a grouped path refuse, naming the layout (registry-driven over DECODE_FORMS)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax import UsageError
from spectral_jax.attention import (
    ATTENTIONS,
    DECODE_FORMS,
    decode_methods,
    decode_step,
    init_decode_state,
    prefill,
)

B, T, HQ, HKV, D = 2, 9, 6, 2, 4
P = 5
GROUPED = tuple(n for n in decode_methods() if DECODE_FORMS[ATTENTIONS[n].decode].grouped)
EXTRA = {"local": {"window": 3}, "linear": {"chunk_size": 4}, "performer": {"chunk_size": 4}}


def _inputs(name: str):
    """q, k, v, the method's parameters, and its per-token arrays (gates) per key/value
    head, ``(B, T, HKV, ...)``."""
    ks = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(ks[0], (B, T, HQ, D))
    k, v = (jax.random.normal(kk, (B, T, HKV, D)) for kk in ks[1:])
    spec = ATTENTIONS[name]
    kwargs = spec.call_kwargs(jax.random.key(5), budget=spec.test_budget, length=T, head_dim=D)
    kwargs.update(EXTRA.get(name, {}))
    tokens = {}
    for arg, axis, batched in spec.token_arrays:
        if batched and arg in kwargs:
            x = kwargs.pop(arg)
            tokens[arg] = jnp.broadcast_to(x, (B, T, HKV, *x.shape[x.ndim + axis + 2:]))
    return q, k, v, kwargs, tokens


def test_every_decode_form_groups_heads():
    assert GROUPED == decode_methods()


@pytest.mark.parametrize("name", GROUPED)
def test_grouped_prefill_and_steps_equal_the_grouped_and_repeated_causal_runs(name):
    q, k, v, kwargs, tokens = _inputs(name)
    fn = jax.jit(functools.partial(ATTENTIONS[name].fn, is_causal=True, **kwargs))
    full = fn(q, k, v, **tokens)
    g = HQ // HKV
    repeated = fn(q, *(jnp.repeat(x, g, axis=2) for x in (k, v)),
                  **{n: jnp.repeat(x, g, axis=2) for n, x in tokens.items()})
    scale = float(jnp.max(jnp.abs(full)))
    if name != "retnet":  # RetNet's decay is set per state head, so repeating changes it
        np.testing.assert_allclose(full, repeated, rtol=0, atol=1e-5 * scale)
    lengths = jnp.array([P, 2])

    @jax.jit
    def run(q, k, v):
        out, state = prefill(name, q[:, :P], k[:, :P], v[:, :P], max_length=T,
                             lengths=lengths, **kwargs,
                             **{n: x[:, :P] for n, x in tokens.items()})
        rows = []
        for t in range(T - P):  # example 0 continues at P, example 1 at 2 (its own position)
            at = (lengths + t)[:, None, None, None]
            pick = {n: jnp.take_along_axis(x, at.reshape(B, 1, *(1,) * (x.ndim - 2)), axis=1)
                    for n, x in tokens.items()}
            y, state = decode_step(state, *(jnp.take_along_axis(x, at, axis=1)
                                            for x in (q, k, v)), **kwargs, **pick)
            rows.append(y[:, 0])
        return out, jnp.stack(rows, 1), state

    out, steps, state = run(q, k, v)
    # The state holds the key/value heads: 1/3 of what repeated heads would hold.
    assert all(a.shape[1] == HKV for a in state.arrays.values())
    for b, length in enumerate(np.asarray(lengths)):
        np.testing.assert_allclose(out[b, :length], full[b, :length], rtol=0,
                                   atol=1e-5 * scale, err_msg=f"prefill, example {b}")
        np.testing.assert_allclose(steps[b], full[b, length:length + T - P], rtol=0,
                                   atol=1e-5 * scale, err_msg=f"steps, example {b}")


@pytest.mark.parametrize("name", GROUPED)
def test_a_grouped_state_is_a_groups_fraction_of_the_repeated_one(name):
    _, _, _, kwargs, _ = _inputs(name)
    kwargs = {n: a for n, a in kwargs.items() if n != "chunk_size"}
    sizes = [init_decode_state(name, batch_shape=(B,), max_length=T, num_heads=h, head_dim=D,
                               **kwargs).nbytes for h in (HKV, HQ)]
    assert sizes[0] * (HQ // HKV) == sizes[1]


def test_a_step_with_other_key_heads_than_the_state_is_refused():
    state = init_decode_state("softmax", batch_shape=(B,), max_length=T, num_heads=HKV,
                              head_dim=D)
    x = jnp.ones((B, 1, HQ, D))
    with pytest.raises(UsageError, match=r"built for batch \(2,\) and 2 key/value heads; got "
                                         r"value of shape \(2, 1, 6, 4\)"):
        decode_step(state, x, x, x)
    with pytest.raises(UsageError, match=r"multiple of the key/value heads"):
        decode_step(state, jnp.ones((B, 1, 3, D)), x[..., :HKV, :], x[..., :HKV, :])


@pytest.mark.parametrize("name", [n for n in decode_methods() if ATTENTIONS[n].grouped_values])
def test_grouped_values_decode_like_the_causal_run(name):
    # Two value heads per key head: the state keeps a key head's sums for both (the linear
    # forms side by side) or one state per value head (the recurrent family).
    ks = jax.random.split(jax.random.key(4), 3)
    q, k = (jax.random.normal(x, (B, T, HKV, D)) for x in ks[:2])
    v = jax.random.normal(ks[2], (B, T, 2 * HKV, D))
    spec = ATTENTIONS[name]
    kwargs = spec.call_kwargs(jax.random.key(5), budget=spec.test_budget, length=T, head_dim=D)
    kwargs.update(EXTRA.get(name, {}))
    heads = HKV if name == "gated_linear" else 2 * HKV  # gates per key head / state head
    tokens = {}
    for arg, axis, batched in spec.token_arrays:
        if batched and arg in kwargs:
            x = kwargs.pop(arg)
            tokens[arg] = jnp.broadcast_to(x, (B, T, heads, *x.shape[x.ndim + axis + 2:]))
    full = spec.fn(q, k, v, is_causal=True, **kwargs, **tokens)
    kwargs.pop("chunk_size", None)

    @jax.jit
    def run(q, k, v, tokens):
        out, state = prefill(name, q[:, :P], k[:, :P], v[:, :P], max_length=T, **kwargs,
                             **{n: x[:, :P] for n, x in tokens.items()})
        rows = [out]
        for t in range(P, T):
            y, state = decode_step(state, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                                   **kwargs, **{n: x[:, t:t + 1] for n, x in tokens.items()})
            rows.append(y)
        return jnp.concatenate(rows, axis=1)

    np.testing.assert_allclose(run(q, k, v, tokens), full, rtol=0,
                               atol=1e-5 * float(jnp.abs(full).max()))
