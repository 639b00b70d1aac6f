"""Decoding as Flax decodes: the NNX module's cache variables carry Flax's names and the
softmax cache Flax's contents, and the Linen module decodes from its ``"cache"`` collection
(``init`` on the whole input, then ``apply(..., mutable=["cache"])`` per token), equal to
the causal run for every method that decodes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from spectral_jax import linen as sj_linen
from spectral_jax.attention import decode_methods
from spectral_jax.nn import MultiHeadAttention

B, N, E, H = 2, 6, 8, 2
X = jax.random.normal(jax.random.key(0), (B, N, E))


def test_the_nnx_cache_has_flax_s_names_and_softmax_s_keys_and_values():
    ours = MultiHeadAttention(H, E, attention="softmax", is_causal=True, decode=True,
                              rngs=nnx.Rngs(0))
    flax_layer = nnx.MultiHeadAttention(H, E, decode=True, rngs=nnx.Rngs(1))
    nnx.update(flax_layer, nnx.state(ours, nnx.Param))
    ours.init_cache(X.shape)
    flax_layer.init_cache(X.shape)
    step_ours = nnx.jit(lambda m, t: m(t))
    causal = nn.make_causal_mask(jnp.ones((B, N)))
    step_flax = nnx.jit(lambda m, t, mask: m(t, mask=mask))
    for t in range(N - 2):
        np.testing.assert_allclose(step_ours(ours, X[:, t:t + 1]),
                                   step_flax(flax_layer, X[:, t:t + 1], causal[:, :, t:t + 1]),
                                   atol=1e-6)
    names = set(nnx.to_pure_dict(nnx.state(ours, nnx.Cache)))
    assert {"cached_key", "cached_value", "cache_index"} <= names
    assert int(ours.cache_index[...]) == int(flax_layer.cache_index[...]) == N - 2
    # Ours stores (batch, heads, max_length, head_dim); Flax (batch, max_length, heads, ...).
    for name in ("cached_key", "cached_value"):
        np.testing.assert_allclose(jnp.swapaxes(getattr(ours, name)[...], 1, 2),
                                   getattr(flax_layer, name)[...], atol=1e-6)


@pytest.mark.parametrize("name", decode_methods())
def test_linen_decoding_equals_the_causal_run(name):
    kwargs = {"num_features": 16} if name == "performer" else (
        {"window": 2} if name == "local" else {})
    layer = sj_linen.MultiHeadAttention(H, E, attention=name, attention_kwargs=kwargs,
                                        is_causal=True, decode=True, num_kv_heads=1)
    variables = layer.init(jax.random.key(1), X)
    cache = variables["cache"]
    assert cache["cache_max_length"].shape == (N, 0) and int(cache["cache_index"]) == 0
    assert any(key.startswith("cached_") for key in cache)
    rest = {k: v for k, v in variables.items() if k != "cache"}
    full = layer.clone(decode=False).apply(rest, X)
    step = jax.jit(lambda v, t: layer.apply(v, t, mutable=["cache"]))
    outs = []
    for t in range(N):
        y, update = step(variables, X[:, t:t + 1])
        variables = {**variables, **update}
        outs.append(y)
    assert int(variables["cache"]["cache_index"]) == N
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=0,
                               atol=2e-5 * float(jnp.abs(full).max()))
