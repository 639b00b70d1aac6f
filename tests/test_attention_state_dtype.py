"""Float64 inputs with float32 state (as make_state and float32 module parameters give) are
computed in float64: the state's dtype never narrows the inputs'."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.attention import get_attention_spec

# The methods whose float32 state is a sequence read as queries (summary methods).
METHODS = ("inducing_points", "luna")


@pytest.mark.parametrize("name", METHODS)
def test_float64_inputs_with_float32_state_compute_in_float64(name):
    spec = get_attention_spec(name)
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (2, 24, 2, 8), jnp.float64) for kk in keys)
        state = spec.make_state(jax.random.key(1), budget=6, length=24, head_dim=8)
        assert all(s.dtype == jnp.float32 for s in state.values())
        wide = {n: s.astype(jnp.float64) for n, s in state.items()}
        out = spec.fn(q, k, v, **state)
        ref = spec.fn(q, k, v, **wide)
        assert out.dtype == jnp.float64
        # Same float32 state values, so in float64 both calls agree to rounding.
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", METHODS)
def test_bfloat16_inputs_with_float32_state_keep_float32_accumulation(name):
    spec = get_attention_spec(name)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (2, 24, 2, 8)) for kk in keys)
    state = spec.make_state(jax.random.key(1), budget=6, length=24, head_dim=8)
    low = spec.fn(*(x.astype(jnp.bfloat16) for x in (q, k, v)), **state)
    ref = spec.fn(*(x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k, v)), **state)
    assert low.dtype == jnp.bfloat16
    # Only the final cast to bfloat16 separates them.
    np.testing.assert_array_equal(np.asarray(low), np.asarray(ref.astype(jnp.bfloat16)))
