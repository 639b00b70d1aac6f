"""``attention_kwargs`` is a mapping everywhere (pairs accepted), stored in one hashable form."""

from __future__ import annotations

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from spectral_jax import linen as sj_linen
from spectral_jax.nn import MultiHeadAttention, SequenceClassifier, TransformerConfig


def _config(attention_kwargs: object) -> TransformerConfig:
    return TransformerConfig(vocab_size=10, num_classes=2, max_length=6, num_layers=1,
                             embed_dim=8, num_heads=2, qkv_dim=8, mlp_dim=8, dropout_rate=0.0,
                             attention="nystrom", attention_kwargs=attention_kwargs)


def test_transformer_config_takes_a_mapping_and_stays_hashable():
    given = {"num_landmarks": 3, "conv_kernel_size": 3}
    cfg = _config(given)
    assert cfg.attention_kwargs == (("conv_kernel_size", 3), ("num_landmarks", 3))
    assert cfg.attention_kwargs_dict == given
    pairs = _config((("num_landmarks", 3), ("conv_kernel_size", 3)))  # other order, pairs
    assert pairs == cfg and hash(pairs) == hash(cfg)
    assert _config([["num_landmarks", 3], ["conv_kernel_size", 3]]) == cfg  # lists of lists
    given["num_landmarks"] = 5  # the config holds its own copy
    assert cfg.attention_kwargs_dict["num_landmarks"] == 3
    assert dataclasses.replace(cfg, num_layers=2).attention_kwargs == cfg.attention_kwargs
    assert _config(None).attention_kwargs == () == _config({}).attention_kwargs


def test_configs_from_either_form_build_the_same_model():
    tokens = jnp.array([[1, 2, 3, 4, 0, 0]])
    logits = [SequenceClassifier(_config(form), rngs=nnx.Rngs(0))(tokens)
              for form in ({"num_landmarks": 3}, (("num_landmarks", 3),))]
    chex.assert_trees_all_equal(*logits)


@pytest.mark.parametrize("value, error, message", [
    ("num_landmarks=3", TypeError,
     "TransformerConfig: `attention_kwargs` must be a mapping of parameter names to values, "
     "e.g. {'num_landmarks': 64}; got 'num_landmarks=3'."),
    ((("num_landmarks",),), TypeError, "`attention_kwargs` must be a mapping of parameter "
                                       "names to values"),
    ({3: 4}, TypeError, "`attention_kwargs` must be a mapping of parameter names to values, "
                        "e.g. {'num_landmarks': 64} (str names); got {3: 4}."),
    ((("num_landmarks", 3), ("num_landmarks", 4)), ValueError,
     "TransformerConfig: `attention_kwargs` must be pairs with distinct names; got "
     "(('num_landmarks', 3), ('num_landmarks', 4))."),
    ({"num_landmarks": [3]}, TypeError,
     "TransformerConfig: `attention_kwargs['num_landmarks']` must be hashable (a number, str, "
     "bool, None or tuple), as configs and modules are hashed; got [3]."),
])
def test_transformer_config_refuses_other_forms(value, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _config(value)


def test_nnx_attention_takes_pairs_as_the_same_mapping():
    x = jax.random.normal(jax.random.key(0), (1, 6, 8))
    outs = [MultiHeadAttention(2, 8, attention="nystrom", attention_kwargs=form,
                               rngs=nnx.Rngs(0))(x)
            for form in ({"num_landmarks": 3}, (("num_landmarks", 3),))]
    chex.assert_trees_all_equal(*outs)
    with pytest.raises(TypeError, match=re.escape(
            "MultiHeadAttention: `attention_kwargs['num_landmarks']` must be hashable")):
        MultiHeadAttention(2, 8, attention="nystrom", attention_kwargs={"num_landmarks": [3]},
                           rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="MultiHeadAttention: `attention_kwargs` must be a mapping"):
        MultiHeadAttention(2, 8, attention="nystrom", attention_kwargs="num_landmarks",
                           rngs=nnx.Rngs(0))


def test_linen_attention_takes_a_mapping_and_stays_hashable():
    layer = sj_linen.MultiHeadAttention(2, 8, attention="nystrom",
                                        attention_kwargs={"num_landmarks": 3})
    pairs = sj_linen.MultiHeadAttention(2, 8, attention="nystrom",
                                        attention_kwargs=(("num_landmarks", 3),))
    assert layer.attention_kwargs == (("num_landmarks", 3),)
    assert layer == pairs and hash(layer) == hash(pairs)
    x = jax.random.normal(jax.random.key(0), (1, 6, 8))
    variables = layer.init(jax.random.key(0), x)
    # The module is a static argument of jit: it must hash.
    apply = jax.jit(lambda m, v, x: m.apply(v, x), static_argnums=0)
    chex.assert_trees_all_close(apply(layer, variables, x), pairs.apply(variables, x),
                                atol=1e-6)
    with pytest.raises(TypeError, match=re.escape("`attention_kwargs` must be a mapping")):
        sj_linen.MultiHeadAttention(2, 8, attention_kwargs=3)


def test_linen_classifier_config_from_a_mapping_is_hashable_under_jit():
    model = sj_linen.SequenceClassifier(_config({"num_landmarks": 3}))
    hash(model)
    tokens = jnp.array([[1, 2, 3, 4, 0, 0]])
    variables = jax.jit(model.init)(jax.random.key(0), tokens)
    assert jax.jit(model.apply)(variables, tokens).shape == (1, 2)
