"""Grouped-query heads on a sequence split over devices: the sharded call equals the
single-device grouped call (outputs and gradients), and the forms that pass only key/value
data between devices pass it for the key/value heads alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import GROUPED, method_kwargs
from recurrent_cases import inputs

from spectral_jax.attention import ATTENTIONS
from spectral_jax.lra.compiled import collectives
from spectral_jax.parallel import sequence_parallel

N, D = 64, 8
LENGTHS = jnp.array([37, 5])  # a boundary inside a shard; all valid tokens on shard 0
SHARDED = [n for n in GROUPED if ATTENTIONS[n].sequence_parallel is not None]
CASES = ([(n, False) for n in SHARDED if not ATTENTIONS[n].causal_only]
         + [(n, True) for n in SHARDED if ATTENTIONS[n].supports_causal])
# Forms whose collectives carry key/value blocks, key-value sums or a key/value halo only.
KEY_VALUE_ONLY = ("ring", "feature_reductions", "halo", "state_prefix")


def _mesh(devices: int = 4) -> jax.sharding.Mesh:
    return jax.make_mesh((devices,), ("seq",), devices=jax.devices()[:devices])


def _value_and_grads(fn, q, k, v, **kwargs):
    def loss(q, k, v):
        out = fn(q, k, v, query_seq_lengths=LENGTHS, key_value_seq_lengths=LENGTHS, **kwargs)
        return jnp.sum(jnp.sin(out)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)


def _assert_equal(sharded, single):
    (_, got), got_grads = sharded
    (_, want), want_grads = single
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize(("name", "is_causal"), CASES)
def test_grouped_heads_shard_like_one_device(name, is_causal):
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (2, N, 4, D))
    k, v = (jax.random.normal(x, (2, N, 2, D)) for x in ks[1:])
    kwargs = dict(method_kwargs(name, n=N, head_dim=D), **({"is_causal": True}
                                                          if is_causal else {}))
    single = _value_and_grads(ATTENTIONS[name].fn, q, k, v, **kwargs)
    _assert_equal(_value_and_grads(sequence_parallel(name, mesh=_mesh()), q, k, v, **kwargs),
                  single)
    assert float(jnp.abs(single[0][1][1, 5:]).max()) == 0.0  # padded queries stay zero


@pytest.mark.parametrize("heads", [(4, 2, 2), (2, 2, 4)], ids=["grouped_query",
                                                              "grouped_value"])
@pytest.mark.parametrize("method", ["gla", "mamba2", "gated_deltanet"])
def test_the_recurrent_family_s_grouped_forms_shard_like_one_device(method, heads):
    q, k, v, kw = inputs(method, 3, batch=2, n=N, heads=heads)
    arrays = {n: jnp.asarray(x, jnp.float32) for n, x in kw.items() if isinstance(x, np.ndarray)}
    static = {n: x for n, x in kw.items() if n not in arrays}
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    fn = ATTENTIONS[method].fn
    _assert_equal(_value_and_grads(sequence_parallel(method, mesh=_mesh()), q, k, v,
                                   is_causal=True, **arrays, **static),
                  _value_and_grads(fn, q, k, v, is_causal=True, **arrays, **static))


GROUPED_VALUES = [n for n in SHARDED if ATTENTIONS[n].grouped_values]


@pytest.mark.parametrize("name", GROUPED_VALUES)
def test_grouped_values_shard_like_one_device(name):
    ks = jax.random.split(jax.random.key(1), 3)
    q, k = (jax.random.normal(x, (2, N, 2, D)) for x in ks[:2])
    v = jax.random.normal(ks[2], (2, N, 4, D))  # two value heads per key head
    kwargs = dict(method_kwargs(name, n=N, head_dim=D), is_causal=True)
    _assert_equal(_value_and_grads(sequence_parallel(name, mesh=_mesh()), q, k, v, **kwargs),
                  _value_and_grads(ATTENTIONS[name].fn, q, k, v, **kwargs))


def _traffic(name: str, heads: int, kv_heads: int) -> int:
    """Elements in the collectives of the compiled forward call on 4 devices."""
    fn = sequence_parallel(name, mesh=_mesh(), **method_kwargs(name, n=256, head_dim=D,
                                                                budget=16))
    q = jax.ShapeDtypeStruct((1, 256, heads, D), jnp.float32)
    k = jax.ShapeDtypeStruct((1, 256, kv_heads, D), jnp.float32)
    causal = {"is_causal": True} if ATTENTIONS[name].causal_only else {}
    return sum(c.size for c in collectives(
        jax.jit(lambda q, k, v: fn(q, k, v, **causal)).lower(q, k, k).compile()))


@pytest.mark.parametrize("name", [n for n in SHARDED
                                  if ATTENTIONS[n].sequence_parallel in KEY_VALUE_ONLY])
def test_key_value_traffic_is_that_of_the_key_value_heads(name):
    # 8 query heads sharing one key/value head move what one head moves: 1/8 of the
    # traffic of the same call with the key/value head repeated to 8 (up to a few scalars
    # that do not scale with the heads, such as Performer's stabiliser).
    grouped, one_head, repeated = (_traffic(name, 8, 1), _traffic(name, 1, 1),
                                   _traffic(name, 8, 8))
    assert grouped == one_head > 0
    assert abs(repeated - 8 * one_head) <= 0.01 * repeated
