"""Flax's MultiHeadAttention fields on ours (NNX and Linen): in_kv_features, separate key and
value inputs, initializers, precision, normalize_qk, keep_rngs with a call's rngs, and
sow_weights. With the exact method, our module and Flax's hold the same parameter tree and
give the same outputs."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax import linen as sj_linen
from spectral_jax.nn import MultiHeadAttention

X = jax.random.normal(jax.random.key(0), (2, 7, 8))
K = jax.random.normal(jax.random.key(1), (2, 5, 6))
V = jax.random.normal(jax.random.key(2), (2, 5, 6))
FIELDS = dict(num_kv_heads=2, in_kv_features=6, normalize_qk=True,
              bias_init=nnx.initializers.normal(0.1), out_kernel_init=nnx.initializers.normal(0.3),
              out_bias_init=nnx.initializers.normal(0.2), precision=jax.lax.Precision.HIGHEST)


def _shapes(module):
    return jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(module, nnx.Param)))


@pytest.mark.parametrize("attention", ["softmax", "nystrom", "performer"])
def test_our_fields_build_flax_s_parameter_tree(attention):
    ours = MultiHeadAttention(4, 8, attention=attention, qkv_features=16, rngs=nnx.Rngs(0),
                              **FIELDS)
    flax_layer = nnx.MultiHeadAttention(4, 8, qkv_features=16, decode=False, rngs=nnx.Rngs(0),
                                        **FIELDS)
    assert _shapes(ours) == _shapes(flax_layer)
    assert set(_shapes(ours)) >= {"query_ln", "key_ln"}
    # The out initializers are the ones given, not kernel_init's: std 0.3 and 0.2.
    assert 0.2 < float(jnp.std(ours.out.kernel.get_value())) < 0.4
    assert 0.1 < float(jnp.std(ours.out.bias.get_value())) < 0.3


def test_softmax_with_every_field_equals_flax_for_separate_key_and_value_inputs():
    ours = MultiHeadAttention(4, 8, attention="softmax", qkv_features=16, rngs=nnx.Rngs(0),
                              **FIELDS)
    flax_layer = nnx.MultiHeadAttention(4, 8, qkv_features=16, decode=False, rngs=nnx.Rngs(1),
                                        **FIELDS)
    nnx.update(flax_layer, nnx.state(ours, nnx.Param))
    mask = nnx.make_attention_mask(jnp.ones((2, 7), bool), jnp.arange(5) < jnp.array([[5], [3]]))
    chex.assert_trees_all_close(ours(X, K, V, mask=mask), flax_layer(X, K, V, mask=mask),
                                atol=1e-6)
    # inputs_v defaults to the key inputs, as Flax's inputs_v defaults to inputs_k.
    chex.assert_trees_all_close(ours(X, K), flax_layer(X, K), atol=1e-6)


def test_sow_weights_sows_flax_s_attention_weights_or_refuses():
    ours = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0))
    flax_layer = nnx.MultiHeadAttention(2, 8, decode=False, rngs=nnx.Rngs(1))
    nnx.update(flax_layer, nnx.state(ours, nnx.Param))
    ours(X, sow_weights=True)
    flax_layer(X, sow_weights=True)
    got = nnx.state(ours, nnx.Intermediate)["attention_weights"].get_value()[0]
    expected = nnx.state(flax_layer, nnx.Intermediate)["attention_weights"].get_value()[0]
    assert got.shape == (2, 2, 7, 7)
    chex.assert_trees_all_close(got, expected, atol=1e-6)
    with pytest.raises(UnsupportedError, match=r"attention='linear' forms none .*\['softmax'\]"):
        MultiHeadAttention(2, 8, attention="linear", rngs=nnx.Rngs(0))(X, sow_weights=True)


def test_keep_rngs_false_takes_the_dropout_stream_from_the_call():
    layer = MultiHeadAttention(2, 8, attention="softmax", dropout_rate=0.5, keep_rngs=False,
                               rngs=nnx.Rngs(0))
    assert layer.dropout_rng is None
    with pytest.raises(UsageError, match="keep_rngs=False needs the call's `rngs`"):
        layer(X, deterministic=False)
    first = layer(X, deterministic=False, rngs=nnx.Rngs(dropout=3))
    again = layer(X, deterministic=False, rngs=nnx.Rngs(dropout=3))
    other = layer(X, deterministic=False, rngs=nnx.Rngs(dropout=4))
    chex.assert_trees_all_equal(first, again)
    assert float(jnp.abs(first - other).max()) > 0.1
    assert float(jnp.abs(first - layer(X, deterministic=True)).max()) > 0.1


def test_bad_fields_are_named():
    with pytest.raises(ValueError, match="in_kv_features"):
        MultiHeadAttention(2, 8, in_kv_features=0, rngs=nnx.Rngs(0))
    with pytest.raises(UnsupportedError, match="in_kv_features must equal in_features=8"):
        MultiHeadAttention(2, 8, in_kv_features=6, attention_kwargs={"symmetric": True},
                           rngs=nnx.Rngs(0))
    layer = MultiHeadAttention(2, 8, in_kv_features=6, attention="softmax", rngs=nnx.Rngs(0))
    with pytest.raises(UsageError, match=r"`inputs_kv` must be .* in_kv_features=6"):
        layer(X, X)


def test_linen_fields_give_flax_linen_s_tree_and_outputs():
    kw = {k: v for k, v in FIELDS.items() if k not in ("in_kv_features", "num_kv_heads")}
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=16, out_features=8,
                                                 deterministic=True, **kw)
    ours = sj_linen.MultiHeadAttention(4, 8, attention="softmax", qkv_features=16,
                                       in_kv_features=6, deterministic=True, **kw)
    flax_vars = flax_layer.init(jax.random.key(0), X, K, V)
    assert (jax.tree.map(jnp.shape, flax_vars)
            == jax.tree.map(jnp.shape, ours.init(jax.random.key(1), X, K, inputs_v=V)))
    chex.assert_trees_all_close(ours.apply(flax_vars, X, K, inputs_v=V),
                                flax_layer.apply(flax_vars, X, K, V), atol=1e-6)


def test_linen_takes_segment_ids_like_nnx():
    ids = jnp.array([[1, 1, 1, 2, 2, 2, 0]] * 2)
    ours = sj_linen.MultiHeadAttention(2, 8, attention="linear", is_causal=True, rope=True)
    variables = ours.init(jax.random.key(0), X)
    packed = ours.apply(variables, X, segment_ids=ids)
    alone = ours.apply(variables, X[:, 3:6])
    chex.assert_trees_all_close(packed[:, 3:6], alone, atol=1e-5)


def _doubled_dot(*args, **kwargs):
    return 2.0 * jax.lax.dot_general(*args, **kwargs)


def test_flax_s_pass_through_fields_reach_the_projections_as_in_flax():
    fields = dict(qkv_dot_general=_doubled_dot, out_dot_general=_doubled_dot,
                  kernel_metadata={"tag": "qkv"}, out_kernel_metadata={"tag": "out"},
                  bias_metadata={"tag": "bias"}, query_ln_scale_metadata={"tag": "q_ln"},
                  normalize_qk=True)
    ours = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0), **fields)
    flax_layer = nnx.MultiHeadAttention(2, 8, decode=False, rngs=nnx.Rngs(1), **fields)
    nnx.update(flax_layer, nnx.state(ours, nnx.Param))
    chex.assert_trees_all_close(ours(X), flax_layer(X), atol=1e-6)
    plain = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0), normalize_qk=True)
    nnx.update(plain, nnx.state(ours, nnx.Param))
    assert float(jnp.abs(ours(X) - plain(X)).max()) > 0.1  # the doubled products are used
    for layer in (ours, flax_layer):
        assert layer.query.kernel.get_metadata()["tag"] == "qkv"
        assert layer.out.kernel.get_metadata()["tag"] == "out"
        assert layer.out.bias.get_metadata()["tag"] == "bias"
        assert layer.query_ln.scale.get_metadata()["tag"] == "q_ln"
    with pytest.raises(UsageError, match=r"unknown keyword argument\(s\) \['qkv_dot'\]"):
        MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0), qkv_dot=_doubled_dot)


def test_linen_dot_general_fields_equal_flax_linen_s():
    ours = sj_linen.MultiHeadAttention(2, 8, attention="softmax", qkv_dot_general=_doubled_dot,
                                       out_dot_general=_doubled_dot)
    theirs = nn.MultiHeadDotProductAttention(2, qkv_features=8, out_features=8,
                                             qkv_dot_general=_doubled_dot,
                                             out_dot_general=_doubled_dot)
    variables = ours.init(jax.random.key(0), X)
    chex.assert_trees_all_close(ours.apply(variables, X), theirs.apply(variables, X),
                                atol=1e-6)
