"""Survey-I state in MultiHeadAttention: learned memory-compression weights, sampling keys."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax.nn import MemoryConvState, MultiHeadAttention

B, L, E, H = 2, 12, 8, 2


def _x(seed=0):
    return jax.random.normal(jax.random.key(seed), (B, L, E))


def test_memory_conv_weights_are_learned_params_and_kernel_one_identity_is_softmax():
    layer = MultiHeadAttention(H, E, attention="memory_compressed",
                               attention_kwargs={"kernel_size": 1}, rngs=nnx.Rngs(0))
    assert isinstance(layer.state, MemoryConvState)
    chex.assert_shape(layer.state.key_conv[...], (H, 1, E // H, E // H))
    params = nnx.state(layer.state, nnx.Param)
    assert {p[-1] for p, _ in nnx.to_flat_state(params)} == {"key_conv", "value_conv"}
    # A gradient reaches both weights.
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(_x(), deterministic=True) ** 2)))(layer)
    assert float(jnp.abs(grads.state.key_conv[...]).sum()) > 0
    assert float(jnp.abs(grads.state.value_conv[...]).sum()) > 0
    # Kernel = stride = 1 with identity weights: the softmax layer with the same projections.
    eye = jnp.broadcast_to(jnp.eye(E // H), (H, 1, E // H, E // H))
    layer.state.key_conv[...] = eye
    layer.state.value_conv[...] = eye
    softmax = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    valid = jnp.arange(L)[None, :] < jnp.array([[7], [L]])
    mask = nnx.make_attention_mask(valid, valid, dtype=jnp.bool_)
    run = nnx.jit(lambda m: m(_x(), mask=mask, deterministic=True))
    chex.assert_trees_all_close(run(layer)[valid], run(softmax)[valid], atol=1e-5, rtol=1e-5)


def test_memory_conv_starts_near_mean_pooling_and_checks_kernel_size():
    state = MemoryConvState({"kernel_size": 3}, num_heads=H, head_dim=4, rngs=nnx.Rngs(0))
    pool = np.broadcast_to(np.eye(4) / 3, (H, 3, 4, 4))
    delta = np.asarray(state.key_conv[...]) - pool
    assert 0 < np.abs(delta).max() < 0.2  # a nudge off pooling, different per head
    assert np.abs(delta[0] - delta[1]).max() > 0
    with pytest.raises(ValueError, match=r"kernel_size.*0"):
        MemoryConvState({"kernel_size": 0}, num_heads=H, head_dim=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size.*'memory_compressed'"):
        MultiHeadAttention(H, E, attention="local", attention_kwargs={"kernel_size": 3},
                           rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", ["clustered", "probsparse"])
def test_sampling_methods_are_deterministic_in_evaluation_and_sample_in_training(name):
    layer = MultiHeadAttention(H, E, attention=name,
                               attention_kwargs={"num_clusters": 3} if name == "clustered"
                               else {"factor": 1}, rngs=nnx.Rngs(0))
    run = nnx.jit(lambda m, x, d: m(x, deterministic=d), static_argnums=2)
    x = _x(1)
    a, b = run(layer, x, True), run(layer, x, True)
    chex.assert_trees_all_equal(a, b)
    t1, t2 = run(layer, x, False), run(layer, x, False)
    assert float(jnp.abs(t1 - t2).max()) > 0  # the sampling stream advances
    chex.assert_trees_all_equal(run(layer, x, True), a)
