"""spectral_jax.linen follows the NNX modules: same arguments, defaults, rules and outputs."""

from __future__ import annotations

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from spectral_jax import linen as sj_linen
from spectral_jax import nn as sj_nn
from spectral_jax.nn import RandomFeatures

X = jax.random.normal(jax.random.key(1), (2, 6, 8))
KV = jax.random.normal(jax.random.key(2), (2, 6, 8))
MASK = jnp.arange(6) < 4
PADDING = (MASK[:, None] & MASK[None, :])[None, None]


def _linen_variables(module: nnx.Module, name: str | None) -> dict:
    """The NNX module's variables in the Linen collections, under submodule ``name`` (None:
    at the top, as the attention layer holds them)."""
    nest = (lambda tree: tree) if name is None else (lambda tree: {name: tree})
    variables = {"params": nest(nnx.to_pure_dict(nnx.state(module, nnx.Param)))}
    features = nnx.to_pure_dict(nnx.state(module, RandomFeatures))
    if features:
        variables["random_features"] = nest(features)
    return variables


CASES = [
    ("softmax", {}),
    ("nystrom", {"num_landmarks": 3, "conv_kernel_size": 3}),
    ("performer", {"num_features": 4}),
    ("skyformer", {"num_landmarks": 3}),
    ("softmax", {"symmetric": "pairwise"}),
]


@pytest.mark.parametrize("attention, kwargs", CASES)
def test_linen_attention_matches_nnx_from_the_same_parameters(attention, kwargs):
    nnx_layer = sj_nn.MultiHeadAttention(2, 8, attention=attention, attention_kwargs=kwargs,
                                         use_bias=False, rngs=nnx.Rngs(3))
    linen_layer = sj_linen.MultiHeadAttention(2, 8, attention=attention,
                                              attention_kwargs=kwargs, use_bias=False)
    variables = _linen_variables(nnx_layer, None)
    init = linen_layer.init(jax.random.key(0), X, KV, mask=PADDING, deterministic=True)
    chex.assert_trees_all_equal_shapes_and_dtypes(init, variables)
    want = nnx_layer(X, KV, mask=PADDING, deterministic=True)
    got = linen_layer.apply(variables, X, KV, mask=PADDING, deterministic=True)
    chex.assert_trees_all_close(got, want, atol=1e-6)
    assert float(jnp.abs(want).max()) > 1e-3  # a real output, not zeros


def test_linen_attention_needs_deterministic_only_where_random():
    # Nyström has nothing random: no `deterministic` anywhere, as for the NNX module.
    layer = sj_linen.MultiHeadAttention(2, 8, attention="nystrom",
                                        attention_kwargs={"num_landmarks": 3})
    variables = layer.init(jax.random.key(0), X)
    chex.assert_trees_all_close(layer.apply(variables, X),
                                layer.apply(variables, X, deterministic=True), atol=0)
    for random in (sj_linen.MultiHeadAttention(2, 8, attention="skyformer"),
                   sj_linen.MultiHeadAttention(2, 8, attention="softmax", dropout_rate=0.1)):
        with pytest.raises(ValueError, match=re.escape(
                "deterministic must be given to MultiHeadAttention (call or constructor) for "
                f"attention={random.attention!r} with dropout_rate={random.dropout_rate}")):
            random.init(jax.random.key(0), X)
        # The field is the call's default, as the NNX constructor's `deterministic`.
        fixed = random.clone(deterministic=True)
        variables = fixed.init(jax.random.key(0), X)
        chex.assert_trees_all_equal(fixed.apply(variables, X),
                                    random.apply(variables, X, deterministic=True))
    with pytest.raises(ValueError, match=r"deterministic=False needs the rng stream\(s\) "
                                         r"'dropout'"):
        fixed.apply(variables, X, deterministic=False)


def test_linen_attention_passes_dtype_and_param_dtype():
    layer = sj_linen.MultiHeadAttention(2, 8, attention="nystrom",
                                        attention_kwargs={"num_landmarks": 3,
                                                          "conv_kernel_size": 3},
                                        dtype=jnp.bfloat16)
    variables = layer.init(jax.random.key(0), X)
    assert {a.dtype for a in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
    out = layer.apply(variables, X)
    assert out.dtype == jnp.bfloat16
    nnx_layer = sj_nn.MultiHeadAttention(2, 8, attention="nystrom",
                                         attention_kwargs={"num_landmarks": 3,
                                                           "conv_kernel_size": 3},
                                         dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    state = nnx.state(nnx_layer)
    nnx.replace_by_pure_dict(state, variables["params"])
    nnx.update(nnx_layer, state)
    chex.assert_trees_all_close(out.astype(jnp.float32),
                                nnx_layer(X).astype(jnp.float32), atol=1e-2)
    half = layer.clone(param_dtype=jnp.bfloat16).init(jax.random.key(0), X)
    assert {a.dtype for a in jax.tree.leaves(half)} == {jnp.dtype(jnp.bfloat16)}


def test_linen_attention_hands_luna_carry_like_nnx():
    kwargs = {"packed_length": 3}
    nnx_layer = sj_nn.MultiHeadAttention(2, 8, attention="luna", attention_kwargs=kwargs,
                                         rngs=nnx.Rngs(0))
    layer = sj_linen.MultiHeadAttention(2, 8, attention="luna", attention_kwargs=kwargs)
    variables = _linen_variables(nnx_layer, None)
    out, carry = layer.apply(variables, X, return_carry=True)
    want, want_carry = nnx_layer(X, return_carry=True)
    chex.assert_trees_all_close((out, carry), (want, want_carry), atol=1e-6)
    chex.assert_trees_all_close(layer.apply(variables, X, carry=carry),
                                nnx_layer(X, carry=carry), atol=1e-6)


def test_linen_classifier_matches_nnx_and_derives_the_mask():
    config = sj_nn.TransformerConfig(vocab_size=10, num_classes=3, max_length=6, num_layers=1,
                                     embed_dim=8, num_heads=2, qkv_dim=8, mlp_dim=8,
                                     dropout_rate=0.0, attention="nystrom",
                                     attention_kwargs={"num_landmarks": 3},
                                     dtype=jnp.bfloat16)
    tokens = jnp.array([[1, 2, 3, 4, 0, 0], [5, 6, 0, 0, 0, 0]])
    nnx_model = sj_nn.SequenceClassifier(config, rngs=nnx.Rngs(0))
    model = sj_linen.SequenceClassifier(config)
    variables = _linen_variables(nnx_model, "model")
    logits = model.apply(variables, tokens)  # mask from the padding id, nothing random
    assert logits.dtype == jnp.float32
    chex.assert_trees_all_close(logits, nnx_model(tokens), atol=1e-6)
    chex.assert_trees_all_equal(logits, model.apply(variables, tokens, tokens > 0,
                                                    deterministic=True))
    with pytest.raises(ValueError, match=r"deterministic must be given: the model is random"):
        sj_linen.SequenceClassifier(dataclasses.replace(config, dropout_rate=0.1)).init(
            jax.random.key(0), tokens)


def test_parameters_move_between_flax_and_our_linen_attention():
    # The same tree as flax.linen.MultiHeadDotProductAttention: Flax's parameters give the
    # same outputs in ours (exact method), with a padding mask, and ours load into Flax's.
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8,
                                                 deterministic=True)
    ours = sj_linen.MultiHeadAttention(2, 8, attention="softmax", deterministic=True)
    x = jax.random.normal(jax.random.key(3), (2, 5, 8))
    mask = nn.make_attention_mask(jnp.array([[1] * 5, [1] * 3 + [0] * 2]),
                                  jnp.array([[1] * 5, [1] * 3 + [0] * 2]))
    flax_vars = flax_layer.init(jax.random.key(0), x)
    our_vars = ours.init(jax.random.key(1), x)
    assert jax.tree.map(jnp.shape, flax_vars) == jax.tree.map(jnp.shape, our_vars)
    expected = flax_layer.apply(flax_vars, x, mask=mask)
    got = ours.apply(flax_vars, x, mask=mask.astype(bool))
    chex.assert_trees_all_close(got[0], expected[0], atol=1e-5)
    chex.assert_trees_all_close(got[1, :3], expected[1, :3], atol=1e-5)  # padded rows differ
    chex.assert_trees_all_close(flax_layer.apply(our_vars, x), ours.apply(our_vars, x),
                                atol=1e-5)
