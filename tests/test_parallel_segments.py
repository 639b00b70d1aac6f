"""Segment ids (packed sequences) on a sequence split over devices: every method whose
registry entry splits ``segment_ids`` with the tokens equals its single-device call, with
documents that cross shard boundaries and shards that one document fills."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import method_kwargs

from spectral_jax import UnsupportedError
from spectral_jax.attention import ATTENTIONS
from spectral_jax.parallel import sequence_parallel

N, D = 32, 8
SPLIT = [n for n, s in ATTENTIONS.items()
         if any(arg == "segment_ids" for arg, *_ in s.token_arrays)
         and ".recurrent." not in s.fn.__module__]  # the family: tests/test_recurrent_parallel
# Documents of 5, 12 and 15 tokens (boundaries inside shards of 8), and one boundary on a
# shard edge followed by padding (id 0) in the second example.
IDS = jnp.asarray(np.repeat([[1, 2, 3], [4, 5, 6]], [5, 12, 15], axis=1), jnp.int32)
IDS = IDS.at[1, 16:].set(7).at[1, 27:].set(0)
LENGTHS = jnp.array([N, 27])


def _mesh():
    return jax.make_mesh((4,), ("seq",), devices=jax.devices()[:4])


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("name", SPLIT)
def test_sharded_segments_equal_one_device(name, is_causal):
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(x, (2, N, 2, D)) for x in ks)
    kwargs = dict(method_kwargs(name, n=N, head_dim=D), segment_ids=IDS,
                  key_value_seq_lengths=LENGTHS, is_causal=is_causal)

    def value_and_grads(fn):
        def loss(q, k, v):
            out = fn(q, k, v, **kwargs)
            return jnp.sum(jnp.sin(out)), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, want), want_grads = value_and_grads(ATTENTIONS[name].fn)
    (_, got), got_grads = value_and_grads(sequence_parallel(name, mesh=_mesh()))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)
    # The split call equals each document alone: document 2 (tokens 5..16) crosses shards.
    alone = ATTENTIONS[name].fn(q[:1, 5:17], k[:1, 5:17], v[:1, 5:17], is_causal=is_causal,
                                **method_kwargs(name, n=12, head_dim=D))
    # Bidirectional Performer's key stabiliser is the whole row's maximum, the document's
    # alone, so the two agree up to its eps (tests/test_attention_segments.py, float64).
    if not (name == "performer" and not is_causal):
        np.testing.assert_allclose(np.asarray(got)[:1, 5:17], alone, atol=2e-5, rtol=2e-5)


def test_query_and_key_ids_on_a_split_sequence_are_refused():
    q = jnp.ones((2, N, 2, D))
    with pytest.raises(UnsupportedError, match=r"pass `segment_ids` \(self-attention\), "
                                               r"not query_segment_ids"):
        jax.jit(lambda q: sequence_parallel("softmax", mesh=_mesh())(
            q, q, q, query_segment_ids=IDS, kv_segment_ids=IDS))(q)
