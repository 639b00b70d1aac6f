"""spectral_jax.nn.MultiHeadAttention(decode=True): token-by-token decoding from init_cache
equals the causal layer on the whole sequence, for every method with a decode form; left
padding; rotary positions; and the errors of bad decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import decode_methods
from spectral_jax.nn import MultiHeadAttention

B, N, E, H = 2, 10, 8, 2
EXTRA = {"local": {"window": 3}, "linear": {"chunk_size": 4}, "performer": {"chunk_size": 4,
         "num_features": 16}, "gated_linear": {"chunk_size": 4}}


def _layer(name: str, **kw) -> MultiHeadAttention:
    return MultiHeadAttention(H, E, attention=name, attention_kwargs=EXTRA.get(name),
                              is_causal=True, rngs=nnx.Rngs(0), **kw)


@nnx.jit
def _step(layer, x, valid):
    return layer(x, decode=True, valid=valid)


@nnx.jit
def _full(layer, x):  # the causal layer on a whole sequence, one program per shape
    return layer(x)


def _x(seed: int = 0, n: int = N) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, n, E))


def _close(a, b):
    scale = float(jnp.max(jnp.abs(b)))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("name", decode_methods())
def test_token_by_token_decode_equals_the_causal_layer(name):
    layer = _layer(name)
    # memory_compressed (kernel 3): a length of whole strides, so the causal run's last
    # row sees no zero-padded tail slot (see its decode form).
    x = _x(n=9 if name == "memory_compressed" else N)
    full = _full(layer, x)
    layer.init_cache(x.shape)
    ones = jnp.ones((B,), bool)
    steps = [_step(layer, x[:, t:t + 1], ones) for t in range(x.shape[1])]
    _close(jnp.concatenate(steps, axis=1), full)
    assert int(layer.cache_index[...]) == x.shape[1]
    np.testing.assert_array_equal(layer.decode_state.position, x.shape[1])


@pytest.mark.parametrize("name", ["softmax", "gated_linear", "local"])
def test_left_padded_prompts_decode_each_example_from_its_own_start(name):
    layer = _layer(name, rope=True)
    x = _x(1)
    pad = np.array([0, 4])  # example 1's first 4 tokens are left padding
    valid = jnp.arange(N)[None, :] >= jnp.asarray(pad)[:, None]
    layer.init_cache((B, N, E))
    # The padded prompt in one call (fed token by token inside), then single steps.
    prompt = _step(layer, x[:, :6], valid[:, :6])
    steps = [_step(layer, x[:, t:t + 1], valid[:, t]) for t in range(6, N)]
    decoded = jnp.concatenate([prompt, *steps], axis=1)
    np.testing.assert_array_equal(layer.decode_state.position, N - pad)
    for b in range(B):
        alone = _full(layer, x[b:b + 1, pad[b]:])[0]  # its own tokens, positions from 0
        _close(decoded[b, pad[b]:], alone)


def test_decode_needs_a_method_with_a_decode_form():
    with pytest.raises(UnsupportedError) as info:
        MultiHeadAttention(H, E, attention="nystrom", decode=True, rngs=nnx.Rngs(0))
    assert str(info.value) == (
        "MultiHeadAttention(decode=True): attention='nystrom' has no causal form, so it "
        "cannot decode token by token. Methods that decode: softmax, linear, performer, "
        "gated_linear, memory_compressed, local, gla, retnet, mamba2, deltanet, gated_deltanet.")
    with pytest.raises(UnsupportedError, match="pass is_causal=True"):
        MultiHeadAttention(H, E, attention="softmax", decode=True, rngs=nnx.Rngs(0))


def test_decode_errors_name_the_value_and_the_limit():
    layer = _layer("linear", decode=True)
    x = _x()
    with pytest.raises(UsageError, match=r"call init_cache\(input_shape, dtype\)"):
        layer(x[:, :1])
    layer.init_cache((B, 3, E))
    with pytest.raises(UsageError, match=r"built for batch \(2,\); got inputs of batch \(1,\)"):
        layer(x[:1, :1])
    with pytest.raises(UsageError, match="inputs_kv and mask must be None"):
        layer(x[:, :1], x[:, :1])
    layer(x[:, :3])
    with pytest.raises(UsageError) as info:
        layer(x[:, 3:4])
    assert str(info.value) == (
        "decode_step(): examples [0, 1] are at position 3: the cache holds max_length=3 "
        "tokens; build it with a larger max_length.")


def test_under_jit_a_token_past_the_cache_turns_the_outputs_nan():
    layer = _layer("softmax", decode=True)
    x = _x()
    layer.init_cache((B, 2, E))
    ones = jnp.ones((B,), bool)
    for t in range(2):
        assert bool(jnp.isfinite(_step(layer, x[:, t:t + 1], ones)).all())
    only_first = jnp.array([True, False])
    out = _step(layer, x[:, 2:3], only_first)
    assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())
    state = layer.decode_state
    np.testing.assert_array_equal(state.ok, [False, True])
    np.testing.assert_array_equal(state.position, [2, 2])  # the refused token is not written
