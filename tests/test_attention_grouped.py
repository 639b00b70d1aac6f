"""Grouped-query heads (GQA / MQA): fewer key/value heads than query heads, each shared by a
group of consecutive query heads, as ``jax.nn.dot_product_attention`` groups them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import GROUPED, method_kwargs

from spectral_jax import UsageError
from spectral_jax.attention import ATTENTIONS, softmax_attention

B, N, D = 2, 16, 8


def _qkv(heads: int, kv_heads: int, seed: int = 0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ks[0], (B, N, heads, D)),
            jax.random.normal(ks[1], (B, N, kv_heads, D)),
            jax.random.normal(ks[2], (B, N, kv_heads, D)))


def _fn(name: str):
    return functools.partial(ATTENTIONS[name].fn, **method_kwargs(name, n=N, head_dim=D))


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1)], ids=["gqa", "mqa"])
def test_grouped_heads_equal_repeated_keys_and_values(name, heads, kv_heads):
    q, k, v = _qkv(heads, kv_heads)
    repeat = functools.partial(jnp.repeat, repeats=heads // kv_heads, axis=-2)
    lengths = jnp.array([N, 11])
    valid = jnp.arange(N)[None, :] < lengths[:, None]
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    fn = jax.jit(_fn(name), static_argnames=("is_causal",))
    calls = [{}, {"query_seq_lengths": lengths, "key_value_seq_lengths": lengths},
             {"mask": mask}]
    if ATTENTIONS[name].supports_causal:
        calls.append({"is_causal": True, "key_value_seq_lengths": lengths})
    for kw in calls:
        grouped = fn(q, k, v, **kw)
        want = fn(q, repeat(k), repeat(v), **kw)
        np.testing.assert_allclose(np.asarray(grouped), np.asarray(want), atol=2e-6,
                                   err_msg=str(sorted(kw)))


GROUPED_VALUES = tuple(n for n, s in ATTENTIONS.items() if s.grouped_values)


def test_the_methods_with_grouped_values():
    assert GROUPED_VALUES == ("linear", "performer", "gated_linear", "gla", "retnet", "mamba2",
                              "deltanet", "gated_deltanet")


@pytest.mark.parametrize("name", GROUPED_VALUES)
def test_grouped_values_equal_queries_and_keys_repeated(name):
    # Value head j reads key (and query) head j // G: as if q and k were repeated to H_v.
    ks = jax.random.split(jax.random.key(3), 3)
    q, k = (jax.random.normal(x, (B, N, 2, D)) for x in ks[:2])
    v = jax.random.normal(ks[2], (B, N, 6, D))
    repeat = functools.partial(jnp.repeat, repeats=3, axis=-2)
    lengths = jnp.array([N, 11])
    fn = jax.jit(_fn(name), static_argnames=("is_causal",))
    calls = [{"is_causal": True, "key_value_seq_lengths": lengths, "query_seq_lengths": lengths}]
    if any(arg == "segment_ids" for arg, _, _ in ATTENTIONS[name].token_arrays):
        calls.append({"is_causal": True,
                      "segment_ids": jnp.repeat(jnp.arange(4), 4)[None].repeat(B, 0)})
    if not ATTENTIONS[name].causal_only:
        calls.append({"key_value_seq_lengths": lengths})
    for kw in calls:
        got = fn(q, k, v, **kw)
        assert got.shape == (B, N, 6, D)
        np.testing.assert_allclose(np.asarray(got), np.asarray(fn(repeat(q), repeat(k), v, **kw)),
                                   atol=2e-6, err_msg=str(sorted(kw)))


@pytest.mark.parametrize("name", ("linear", "performer", "gated_linear"))
def test_grouped_values_with_other_query_heads_are_refused(name):
    q, k, v = _qkv(4, 2)
    with pytest.raises(UsageError, match=r"grouped values \(value heads 4, a multiple of the "
                                         r"key heads 2\) need as many query heads"):
        _fn(name)(q, k, jnp.concatenate([v, v], -2), is_causal=True)


def test_grouped_softmax_is_jax_nns():
    q, k, v = _qkv(6, 2, seed=1)
    np.testing.assert_allclose(np.asarray(softmax_attention(q, k, v, is_causal=True)),
                               np.asarray(jax.nn.dot_product_attention(q, k, v,
                                                                       is_causal=True)),
                               atol=1e-6)


@pytest.mark.parametrize("name", GROUPED)
def test_heads_that_do_not_group_are_refused(name):
    q, k, v = _qkv(3, 2)
    with pytest.raises(UsageError, match=r"query heads must be a multiple of the key/value "
                                         r"heads \(grouped-query attention\); got query 3, "
                                         r"key/value 2"):
        _fn(name)(q, k, v)


def test_key_padding_differing_inside_a_group_is_refused():
    q, k, v = _qkv(4, 2)
    valid = jnp.ones((B, 4, N), bool).at[:, 1, 12:].set(False)  # head 1 shares with head 0
    mask = jnp.ones((B, 4, N, 1), bool) & valid[:, :, None, :]
    with pytest.raises(UsageError, match="the mask differs inside a group"):
        _fn("nystrom")(q, k, v, mask=mask)
