"""prefill + decode_step, token by token, equal the parallel causal form of every method with
one (registry-driven), with prompts of different lengths per example, under jit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.attention import (
    ATTENTIONS,
    DECODE_FORMS,
    decode_methods,
    decode_step,
    init_decode_state,
    prefill,
)

B, T, H, D = 3, 13, 2, 4
LENGTHS = np.array([5, 1, 9])  # prompt lengths; example b then decodes T - LENGTHS[b] tokens
P = int(LENGTHS.max())
# Chunks and windows smaller than the sequence, so scans and bands cross their boundaries.
EXTRA = {"linear": {"chunk_size": 4}, "performer": {"chunk_size": 4},
         "gated_linear": {"chunk_size": 4}, "local": {"window": 3}}
DECODE = decode_methods()
TAIL = 4  # extra tokens after T for the reference (memory_compressed: its tail slot completes)


def test_every_causal_method_has_a_decode_form():
    causal = tuple(n for n, s in ATTENTIONS.items() if s.supports_causal)
    assert DECODE == causal
    assert all(ATTENTIONS[n].decode in DECODE_FORMS for n in DECODE)
    assert {ATTENTIONS[n].decode for n in DECODE} == set(DECODE_FORMS)


def _inputs(name: str, seed: int = 0):
    ks = jax.random.split(jax.random.key(seed), 4)
    n = T + TAIL
    q, k, v = (jax.random.normal(kk, (B, n, H, D)) for kk in ks[:3])
    spec = ATTENTIONS[name]
    kwargs = spec.call_kwargs(jax.random.key(5), budget=spec.test_budget, length=n, head_dim=D)
    kwargs.update(EXTRA.get(name, {}))
    if name == "memory_compressed":  # learned-like weights, not pure pooling
        w = 0.3 * jax.random.normal(ks[3], (H, 3, D, D))
        kwargs.update(key_conv=w + kwargs["key_conv"], value_conv=w[::-1] + kwargs["value_conv"])
    # The per-token arguments (RFA-Gate's gates, the recurrent family's g, β, Δ), one row per
    # example and head, passed to prefill for the prompt and to decode_step token by token.
    tokens = {}
    for arg, axis, _ in spec.token_arrays:
        if arg not in kwargs:  # optional ones (segment_ids)
            continue
        x = kwargs.pop(arg)
        tokens[arg] = jnp.broadcast_to(x, (B, n, H, *x.shape[x.ndim + axis + 2:]))
    if "gates" in tokens:
        tokens["gates"] = jax.nn.sigmoid(2.0 + jax.random.normal(ks[3], (B, n, H)))
    return q, k, v, kwargs, tokens


def _decode(name: str, q, k, v, kwargs, tokens, *, jit: bool):
    """Prefill the first LENGTHS[b] tokens of example b, then step through the rest."""
    index = jnp.clip(jnp.asarray(LENGTHS)[:, None] + jnp.arange(T - LENGTHS.min())[None], 0,
                     T - 1)  # (B, steps): the position example b writes at each step
    take = lambda x: jnp.take_along_axis(  # noqa: E731
        x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)
    def run(q, k, v, tokens):
        out, state = prefill(name, q[:, :P], k[:, :P], v[:, :P], max_length=T,
                             lengths=jnp.asarray(LENGTHS), **kwargs,
                             **{n: x[:, :P] for n, x in tokens.items()})
        valid = jnp.asarray(LENGTHS)[:, None] + jnp.arange(index.shape[1])[None] < T

        def body(state, xs):
            qt, kt, vt, tt, ok = xs
            y, state = decode_step(state, qt[:, None], kt[:, None], vt[:, None], valid=ok,
                                   **kwargs, **{n: x[:, None] for n, x in tt.items()})
            return state, y[:, 0]

        tt = {n: jnp.swapaxes(take(x), 0, 1) for n, x in tokens.items()}
        xs = tuple(jnp.swapaxes(x, 0, 1) for x in (take(q), take(k), take(v)))
        state, ys = jax.lax.scan(body, state, (*xs, tt, jnp.swapaxes(valid, 0, 1)))
        return out, jnp.swapaxes(ys, 0, 1), state

    return (jax.jit(run) if jit else run)(q, k, v, tokens)


@pytest.mark.parametrize("name", DECODE)
def test_prefill_and_steps_equal_the_parallel_causal_run(name):
    q, k, v, kwargs, tokens = _inputs(name)
    # Causal: rows < T do not depend on the tail; memory_compressed's do not either once
    # the tail completes the last slot, which is what a decoder sees (see its decode form).
    full = jax.jit(functools.partial(ATTENTIONS[name].fn, is_causal=True, **kwargs))(
        q, k, v, **tokens)[:, :T]
    out, steps, state = _decode(name, q, k, v, kwargs, tokens, jit=True)
    scale = float(jnp.max(jnp.abs(full)))
    for b, length in enumerate(LENGTHS):
        np.testing.assert_allclose(out[b, :length], full[b, :length], rtol=1e-5,
                                   atol=1e-5 * scale, err_msg=f"prefill, example {b}")
        np.testing.assert_array_equal(out[b, length:], 0.0)
        np.testing.assert_allclose(steps[b, :T - length], full[b, length:], rtol=1e-5,
                                   atol=1e-5 * scale, err_msg=f"steps, example {b}")
        np.testing.assert_array_equal(steps[b, T - length:], 0.0)  # padding steps
    np.testing.assert_array_equal(state.position, T)
    assert bool(state.ok.all())


@pytest.mark.parametrize("name", DECODE)
def test_steps_from_an_empty_state_equal_the_parallel_run(name):
    q, k, v, kwargs, tokens = _inputs(name, seed=1)
    full = jax.jit(functools.partial(ATTENTIONS[name].fn, is_causal=True, **kwargs))(
        q, k, v, **tokens)[:, :T]
    state = init_decode_state(name, batch_shape=(B,), max_length=T, num_heads=H, head_dim=D,
                              **{n: a for n, a in kwargs.items() if n != "chunk_size"})
    step = jax.jit(lambda s, qt, kt, vt, tt: decode_step(s, qt, kt, vt, **kwargs, **tt))
    rows = []
    for t in range(T):
        y, state = step(state, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                        {n: x[:, t:t + 1] for n, x in tokens.items()})
        rows.append(y)
    scale = float(jnp.max(jnp.abs(full)))
    np.testing.assert_allclose(jnp.concatenate(rows, 1), full, rtol=1e-5, atol=1e-5 * scale)
