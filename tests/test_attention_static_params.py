"""A static (Python-level) parameter of any method traced by ``jax.jit``: the error says
how to keep it static, and both ways it names work."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import pytest

import spectral_jax.attention as sa


def _static_cases():
    """Every keyword parameter with a number or bool default, of every method, but Flax's
    and jax.nn's drop-in keywords (a traced ``dropout_rate`` is a schedule, allowed)."""
    import inspect

    from spectral_jax.attention.core._common import FLAX_KWARGS, JAX_NN_KWARGS
    cases = []
    for name in sa.available_attentions():
        for param in inspect.signature(sa.get_attention(name)).parameters.values():
            if (param.kind is param.KEYWORD_ONLY and type(param.default) in (int, float, bool)
                    and param.name not in FLAX_KWARGS | JAX_NN_KWARGS):
                cases.append((name, param.name, param.default))
        if name != "softmax":
            cases.append((name, "head_chunk_size", 1))
    cases.append(("symmetric", "shift", True))
    cases.append(("symmetric", "num_landmarks", 4))
    return cases


@pytest.mark.parametrize(("name", "param", "value"), _static_cases())
def test_traced_static_parameter_says_how_to_keep_it_static(name, param, value):
    # jax.jit(nystrom_attention)(q, k, v, num_landmarks=32) traces the count: the error
    # names both ways to keep it static.
    from attention_cases import method_kwargs
    x = jnp.ones((1, 16, 2, 8))
    if name == "symmetric":
        fn, kwargs = sa.symmetric_spectral_shift_attention, {}
    else:
        fn, kwargs = sa.get_attention(name), method_kwargs(name, n=16, head_dim=8)
    kwargs.pop(param, None)
    call = jax.jit(lambda x, value: fn(x, x, x, **kwargs, **{param: value}))
    method = fn.__name__
    with pytest.raises(TypeError, match=(
            rf"{method}\(\): `{param}` must be a static Python value, but it is traced .*"
            rf"functools.partial\({method}, {param}=...\).*static_argnames=\('{param}',\)")):
        call(x, value)


def test_traced_num_landmarks_and_the_two_ways_it_names():
    q = jnp.ones((1, 64, 2, 8))
    with pytest.raises(TypeError, match=r"`num_landmarks` must be a static Python value.*"
                                        r"functools.partial.*static_argnames"):
        jax.jit(sa.nystrom_attention)(q, q, q, num_landmarks=32)
    # ... and the ways it names work.
    want = sa.nystrom_attention(q, q, q, num_landmarks=32)
    chex.assert_trees_all_close(
        jax.jit(functools.partial(sa.nystrom_attention, num_landmarks=32))(q, q, q), want)
    chex.assert_trees_all_close(
        jax.jit(sa.nystrom_attention, static_argnames=("num_landmarks",))(
            q, q, q, num_landmarks=32), want)
