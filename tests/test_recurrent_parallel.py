"""The recurrent family split over devices: packed segments that cross shard boundaries,
padding, and the delta rule's matrix transition, against one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from recurrent_cases import inputs

from spectral_jax import UsageError
from spectral_jax.attention import get_attention
from spectral_jax.parallel import sequence_parallel


@pytest.mark.parametrize("method", ["gla", "gated_deltanet"])
def test_sharded_segments_and_padding_equal_one_device(method):
    q, k, v, kw = inputs(method, 9, batch=2, n=32, heads=(2, 2, 2))
    arrays = {n: jnp.asarray(x, jnp.float32) for n, x in kw.items() if isinstance(x, np.ndarray)}
    static = {n: x for n, x in kw.items() if n not in arrays}
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    # Segments of 5, 12 and 15 tokens: boundaries inside shards and one exactly on a shard
    # edge (token 16 of 4 shards of 8 would be an edge; 5 + 12 = 17 is one past it).
    ids = jnp.asarray(np.repeat([[0, 1, 2], [3, 4, 5]], [[5, 12, 15]][0], axis=1), jnp.int32)
    ids = ids.at[1, 16:].set(9)  # a boundary on the edge between shards 1 and 2
    lengths = jnp.array([32, 27])
    mesh = jax.make_mesh((4,), ("seq",), devices=jax.devices()[:4])
    fn = get_attention(method)
    sharded = sequence_parallel(method, mesh=mesh)

    def loss(call, q, k, v):
        out = call(q, k, v, segment_ids=ids, query_seq_lengths=lengths,
                   key_value_seq_lengths=lengths, **arrays, **static)
        return jnp.sum(jnp.sin(out)), out

    one = jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))
    split = jax.jit(jax.value_and_grad(lambda *a: loss(sharded, *a), argnums=(0, 1, 2),
                                       has_aux=True))
    (_, out1), grads1 = one(q, k, v)
    (_, out2), grads2 = split(q, k, v)
    np.testing.assert_allclose(out2, out1, rtol=2e-5, atol=2e-5)
    for a, b in zip(grads2, grads1):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_sharded_segment_ids_of_the_wrong_length_name_the_argument():
    q = jnp.ones((2, 8, 2, 4))
    mesh = jax.make_mesh((2,), ("seq",), devices=jax.devices()[:2])
    with pytest.raises(UsageError, match="`segment_ids` must have an entry per key position"):
        sequence_parallel("retnet", mesh=mesh)(q, q, q, segment_ids=jnp.zeros((2, 4), jnp.int32))
