"""``softmax_attention``'s attention-weight dropout: errors name the function, a rate
traced under jit works, and the approximate methods refuse dropout."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest

import spectral_jax.attention as sa


def test_softmax_dropout_errors_name_softmax_attention():
    x = jnp.ones((1, 8, 2, 4))
    rng = jax.random.key(0)
    for rate, match in (
        (1.5, r"must be in \[0, 1\); got 1.5"),
        (-0.1, "must be a finite float >= 0"),
    ):
        with pytest.raises(ValueError, match=rf"^softmax_attention\(\): `dropout_rate` {match}"):
            sa.softmax_attention(x, x, x, dropout_rate=rate, dropout_rng=rng, deterministic=False)
    with pytest.raises(
        ValueError, match=r"^softmax_attention\(\): dropout_rate=0.5 .*`dropout_rng`"
    ):
        sa.softmax_attention(x, x, x, dropout_rate=0.5, deterministic=False)


def test_softmax_dropout_rate_traced_under_jit():
    # A traced rate is a probability for jax.random.bernoulli, so it works, giving what the
    # same concrete rate gives.
    x = jax.random.normal(jax.random.key(1), (2, 8, 2, 4))
    rng = jax.random.key(2)
    call = lambda rate: sa.softmax_attention(  # noqa: E731
        x, x, x, dropout_rate=rate, dropout_rng=rng, deterministic=False
    )
    traced = jax.jit(call)
    chex.assert_trees_all_close(traced(jnp.float32(0.5)), call(0.5), atol=1e-6)
    chex.assert_trees_all_close(traced(jnp.float32(0.0)), sa.softmax_attention(x, x, x), atol=1e-6)
    # The approximate methods have no weight dropout: a traced rate may be nonzero, so it
    # is refused as a concrete nonzero rate is.
    with pytest.raises(
        NotImplementedError, match=r"nystrom_attention\(\): attention-weight dropout"
    ):
        jax.jit(lambda r: sa.nystrom_attention(x, x, x, num_landmarks=4, dropout_rate=r))(0.1)
