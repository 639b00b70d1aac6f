"""spectral_jax.nn: bad call inputs (token ids, feature sizes) get the library's errors."""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.experimental import checkify

from spectral_jax.nn import (
    DualEncoderClassifier,
    MultiHeadAttention,
    SequenceClassifier,
    TokenEmbedding,
    TransformerConfig,
)

VOCAB = 10


def _config(**overrides: object) -> TransformerConfig:
    fields = dict(vocab_size=VOCAB, num_classes=3, max_length=6, num_layers=1, embed_dim=8,
                  num_heads=2, qkv_dim=8, mlp_dim=8, dropout_rate=0.0)
    return TransformerConfig(**{**fields, **overrides})


def _oov_message(low: int, high: int) -> str:
    return re.escape(f"TokenEmbedding: token ids in `inputs` must be in [0, vocab_size={VOCAB}); "
                     f"got smallest id {low} and largest id {high}.")


GOOD = jnp.array([[1, VOCAB - 1, 3, 0, 0, 0], [4, 5, 0, 0, 0, 0]])


@pytest.mark.parametrize("bad_id, low, high", [(VOCAB, 0, VOCAB), (37, 0, 37), (-1, -1, 9)])
def test_concrete_out_of_vocabulary_ids_raise_naming_the_ids_and_vocab_size(bad_id, low, high):
    model = SequenceClassifier(_config(), rngs=nnx.Rngs(0))
    assert bool(jnp.isfinite(model(GOOD)).all())  # ids 0 and vocab_size - 1 are in range
    with pytest.raises(ValueError, match=_oov_message(low, high)):
        model(GOOD.at[1, 1].set(bad_id))
    dual = DualEncoderClassifier(_config(pooling="cls"), rngs=nnx.Rngs(0))
    pairs = jnp.stack([GOOD, GOOD], axis=1)  # (batch, 2, length)
    with pytest.raises(ValueError, match=_oov_message(low, high)):
        dual(pairs.at[0, 1, 2].set(bad_id))
    embed = TokenEmbedding(VOCAB, 4, 6, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=_oov_message(low, high)):
        embed(GOOD.at[0, 0].set(bad_id), deterministic=True)


@pytest.mark.parametrize("bad_id", [VOCAB, -1])
def test_traced_out_of_vocabulary_ids_give_nan_and_fail_under_checkify(bad_id):
    # Negative ids would wrap round to the last rows of the table: they get NaN as well.
    model = SequenceClassifier(_config(), rngs=nnx.Rngs(0))
    bad = GOOD.at[1, 1].set(bad_id)
    logits = nnx.jit(lambda m, t: m(t))(model, bad)
    assert bool(jnp.isnan(logits[1]).all())
    chex.assert_trees_all_close(logits[0], model(GOOD[:1])[0], atol=1e-6)  # row 0 untouched

    checked = nnx.jit(checkify.checkify(lambda m, t: m(t)))
    error, _ = checked(model, bad)
    low, high = (-1, 9) if bad_id < 0 else (0, VOCAB)
    with pytest.raises(checkify.JaxRuntimeError, match=_oov_message(low, high)):
        error.throw()
    error, good = checked(model, GOOD)
    error.throw()  # no error for ids in range
    chex.assert_trees_all_close(good, model(GOOD), atol=1e-6)

    dual = DualEncoderClassifier(_config(), rngs=nnx.Rngs(0))
    pairs = jnp.stack([GOOD, bad], axis=1)
    error, out = nnx.jit(checkify.checkify(lambda m, t: m(t)))(dual, pairs)
    with pytest.raises(checkify.JaxRuntimeError, match=_oov_message(low, high)):
        error.throw()
    assert bool(jnp.isnan(out[1]).all()) and bool(jnp.isfinite(out[0]).all())


def test_the_traced_id_check_keeps_the_program_a_function_of_the_model():
    # Two models built alike, traced one after the other, lower to one program, so the second
    # loads the first's compiled program from JAX's persistent cache.
    def lowered():
        graphdef, state = nnx.split(SequenceClassifier(_config(), rngs=nnx.Rngs(0)))
        return jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)).lower(state, GOOD).as_text()

    first, second = lowered(), lowered()
    assert first == second


@pytest.mark.parametrize("symmetric", [False, True])
def test_feature_size_mismatch_names_in_features_and_the_input(symmetric):
    layer = MultiHeadAttention(4, 64, attention="softmax",
                               attention_kwargs={"symmetric": symmetric}, rngs=nnx.Rngs(0))
    good = jnp.ones((2, 10, 64))
    with pytest.raises(ValueError, match=re.escape(
            "MultiHeadAttention: `inputs_q` must be (batch..., length, in_features) with "
            "in_features=64 on its last axis; got shape (2, 10, 32) (last axis 32).")):
        layer(jnp.ones((2, 10, 32)))
    with pytest.raises(ValueError, match=re.escape(
            "`inputs_kv` must be (batch..., length, in_kv_features) with in_kv_features=64 on "
            "its last axis; got shape (2, 7, 48) (last axis 48).")):
        layer(good, jnp.ones((2, 7, 48)))
    with pytest.raises(ValueError, match=re.escape("`inputs_q` must be (batch..., length, "
                                                   "in_features) with in_features=64 on its "
                                                   "last axis; got shape (64,) (last axis 64).")):
        layer(jnp.ones((64,)))
    assert layer(good, jnp.ones((2, 7, 64))).shape == (2, 10, 64)
    # Under jit the check is on static shapes: the same message.
    with pytest.raises(ValueError,
                       match=r"in_features=64 on its last axis; got shape \(2, 10, 32\)"):
        nnx.jit(lambda m, x: m(x))(layer, jnp.ones((2, 10, 32)))

