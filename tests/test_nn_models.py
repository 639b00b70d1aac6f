"""LRA models in spectral_jax.nn: padding, pooling, retrieval, state, compiles, dtypes, errors,
the default mask and the encoder's carried attention state."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, serialization

from spectral_jax import attention
from spectral_jax.nn import (
    DualEncoderClassifier,
    EncoderBlock,
    SequenceClassifier,
    TransformerConfig,
    TransformerEncoder,
    last_valid,
    masked_mean,
    sinusoidal_positions,
)

VOCAB, LENGTH = 32, 16
# Small method parameters so every method runs on 16 tokens.
SMALL_KWARGS: dict[str, tuple[tuple[str, object], ...]] = {
    "nystrom": (("num_landmarks", 4), ("conv_kernel_size", 3)),
    "spectral_shift": (("num_landmarks", 4),),
    "skyformer": (("num_landmarks", 4),),
    "performer": (("num_features", 16),),
    "linformer": (("proj_len", 4), ("sharing", "layerwise")),
    "inducing_points": (("num_inducing_points", 4),),
    "luna": (("packed_length", 4),),
}
# Methods whose output is exactly independent of how much trailing padding there is.
TRAILING_INVARIANT = ("softmax", "kernelized", "linear", "performer", "inducing_points", "luna",
                      "gated_linear")


def _config(attention_name: str = "softmax", **overrides: object) -> TransformerConfig:
    fields = dict(
        vocab_size=VOCAB, num_classes=3, max_length=LENGTH, num_layers=1, embed_dim=16,
        num_heads=2, qkv_dim=16, mlp_dim=16, dropout_rate=0.0, attention=attention_name,
        attention_kwargs=SMALL_KWARGS.get(attention_name, ()),
        is_causal=attention.get_attention_spec(attention_name).causal_only,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


@nnx.jit(static_argnames="deterministic")
def _logits(model, inputs, mask, deterministic=True):
    return model(inputs, mask, deterministic=deterministic)


def _tokens(seed: int, lengths: list[int], total: int = LENGTH) -> tuple[jax.Array, jax.Array]:
    """Random tokens in 1..VOCAB-1, zero after each row's length; mask = token > 0."""
    ids = jax.random.randint(jax.random.key(seed), (len(lengths), total), 1, VOCAB)
    mask = jnp.arange(total)[None, :] < jnp.array(lengths)[:, None]
    return jnp.where(mask, ids, 0), mask


def test_masked_mean_hand_computed():
    x = jnp.array([[[1.0, 2.0], [3.0, 4.0], [100.0, -50.0]],
                   [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]],
                   [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]])
    mask = jnp.array([[True, True, False], [True, True, True], [False, False, False]])
    expected = np.array([[2.0, 3.0], [7.0, 8.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(masked_mean(x, mask)), expected)


def test_last_valid_hand_computed_for_any_padding_side():
    x = jnp.arange(24.0).reshape(4, 3, 2)
    mask = jnp.array([[True, True, False], [False, True, True], [True, False, True],
                      [False, False, False]])
    expected = np.array([[2.0, 3.0], [10.0, 11.0], [16.0, 17.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(last_valid(x, mask)), expected)
    grad = jax.grad(lambda x: last_valid(x, mask).sum())(x)
    np.testing.assert_array_equal(np.asarray(grad.sum(-1)),
                                  2.0 * np.asarray(mask & (jnp.cumsum(mask[:, ::-1], 1)[:, ::-1]
                                                           == 1)))


def test_last_pooling_of_a_causal_model_reads_the_last_valid_token_only():
    """A causal model pooled at its last valid token: padding and the batch never change an
    example, and its logits equal those of the same tokens with nothing after them."""
    model = SequenceClassifier(_config("gated_deltanet", pooling="last", is_causal=True),
                               rngs=nnx.Rngs(0))
    ids, mask = _tokens(1, [11, 11, 16, 5])
    junk = jax.random.randint(jax.random.key(2), ids.shape, 1, VOCAB)
    ids = ids.at[1].set(jnp.where(mask[0], ids[0], junk[0]))  # same example, padding changed
    logits = _logits(model, ids, mask)
    chex.assert_trees_all_close(logits[0], logits[1], rtol=1e-5, atol=1e-6)
    alone = _logits(model, ids[3:, :5], mask[3:, :5])
    chex.assert_trees_all_close(alone[0], logits[3], rtol=1e-5, atol=1e-6)
    # The real tokens do matter.
    assert float(jnp.abs(logits[0] - logits[2]).max()) > 1e-4


def test_sinusoidal_positions_hand_computed():
    table = sinusoidal_positions(2, 4)  # frequencies 1 and 10000^(-2/4) = 0.01
    expected = [[0.0, 1.0, 0.0, 1.0], [np.sin(1.0), np.cos(1.0), np.sin(0.01), np.cos(0.01)]]
    np.testing.assert_allclose(table, expected, rtol=1e-6)


@pytest.mark.parametrize("name", attention.available_attentions())
def test_logits_ignore_padded_content(name):
    pooling = "cls" if name in ("softmax", "nystrom", "linear") else "mean"
    model = SequenceClassifier(_config(name, pooling=pooling), rngs=nnx.Rngs(0))
    ids, mask = _tokens(1, [11, 11, 16])
    junk = jax.random.randint(jax.random.key(2), ids.shape, 1, VOCAB)
    ids = ids.at[1].set(jnp.where(mask[0], ids[0], junk[0]))  # same example, padding changed
    logits = _logits(model, ids, mask)
    chex.assert_shape(logits, (3, 3))
    assert logits.dtype == jnp.float32
    chex.assert_trees_all_close(logits[0], logits[1], rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(logits[0] - logits[2]).max()) > 1e-4  # the real tokens do matter
    if name in TRAILING_INVARIANT:
        short = _logits(model, ids[:1, :12], mask[:1, :12])
        chex.assert_trees_all_close(short[0], logits[0], rtol=1e-4, atol=1e-5)


def test_dual_encoder_document_embedding_ignores_its_partner():
    config = _config("nystrom", interaction="nli")
    model = DualEncoderClassifier(config, rngs=nnx.Rngs(0))
    ids, mask = _tokens(3, [9, 16, 5])
    pair1 = jnp.stack([ids[:1], ids[1:2]], axis=1)
    pair2 = jnp.stack([ids[:1], ids[2:3]], axis=1)
    m1 = jnp.stack([mask[:1], mask[1:2]], axis=1)
    m2 = jnp.stack([mask[:1], mask[2:3]], axis=1)
    embed = nnx.jit(lambda m, x, k: m.embed(x, k, deterministic=True))
    u1, v1 = embed(model, pair1, m1)
    u2, v2 = embed(model, pair2, m2)
    chex.assert_trees_all_equal(u1, u2)
    assert float(jnp.abs(v1 - v2).max()) > 1e-4
    # The head sees [u, v, u*v, u-v] (NLI interaction).
    head_in = jnp.concatenate([u1, v1, u1 * v1, u1 - v1], axis=-1)
    expected = model.logits(nnx.relu(model.hidden2(nnx.relu(model.hidden(head_in)))))
    chex.assert_trees_all_close(_logits(model, pair1, m1), expected, rtol=1e-5, atol=1e-6)


def test_state_round_trip_is_bitwise_including_performer_projection():
    config = _config("performer", dropout_rate=0.1)
    model = SequenceClassifier(config, rngs=nnx.Rngs(0))
    ids, mask = _tokens(4, [16, 7])
    before = _logits(model, ids, mask)
    not_rng = nnx.Not(nnx.RngState)
    blob = serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(model, not_rng)))

    fresh = SequenceClassifier(config, rngs=nnx.Rngs(99))
    layer = fresh.encoder.layers[0].attention
    assert float(jnp.abs(layer.state.projection[...]
                         - model.encoder.layers[0].attention.state.projection[...]).max()) > 0
    state = nnx.state(fresh, not_rng)
    nnx.replace_by_pure_dict(state, serialization.msgpack_restore(blob))
    nnx.update(fresh, state)
    chex.assert_trees_all_equal(
        layer.state.projection[...], model.encoder.layers[0].attention.state.projection[...]
    )
    chex.assert_trees_all_equal(_logits(fresh, ids, mask), before)


def test_one_compile_per_step_and_equal_config_does_not_recompile():
    @nnx.jit
    @chex.assert_max_traces(n=1)
    def train_step(model, optimizer, ids, mask, labels):
        def loss_fn(m):
            logits = m(ids, mask, deterministic=False)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    ids, mask = _tokens(5, [16, 10])
    labels = jnp.array([0, 2])
    config = _config("softmax", dropout_rate=0.1)
    tx = optax.adam(1e-2)  # a new optax object would be new static data: one tx for both
    losses = []
    for seed in (0, 1):
        model = SequenceClassifier(dataclasses.replace(config), rngs=nnx.Rngs(seed))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        for _ in range(2):
            losses.append(float(train_step(model, optimizer, ids, mask, labels)))
    assert all(np.isfinite(losses))
    assert losses[1] < losses[0]


def test_split_jit_merge_agrees_with_nnx_jit():
    model = SequenceClassifier(_config("softmax", positional="learned"), rngs=nnx.Rngs(0))
    ids, mask = _tokens(6, [16, 4])
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask, deterministic=True)

    merged = forward(state, ids, mask)
    chex.assert_trees_all_close(merged, _logits(model, ids, mask), rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(merged[0] - merged[1]).max()) > 1e-4


def test_bfloat16_compute_with_float32_params():
    config = _config("softmax", dtype=jnp.bfloat16, param_dtype=jnp.float32)
    model = SequenceClassifier(config, rngs=nnx.Rngs(0))
    reference = SequenceClassifier(dataclasses.replace(config, dtype=jnp.float32),
                                   rngs=nnx.Rngs(0))
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {
        jnp.dtype(jnp.float32)
    }
    ids, mask = _tokens(7, [16, 9])
    labels = jnp.array([1, 0])

    @nnx.jit
    def loss_and_grads(m):
        def loss_fn(m):
            logits = m(ids, mask, deterministic=True)
            log_probs = jax.nn.log_softmax(logits)
            assert logits.dtype == log_probs.dtype == jnp.float32
            return -jnp.take_along_axis(log_probs, labels[:, None], axis=1).mean(), logits

        return nnx.value_and_grad(loss_fn, has_aux=True)(m)

    (loss, logits), grads = loss_and_grads(model)
    ref_logits = _logits(reference, ids, mask)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=0.1)
    leaves = jax.tree.leaves(grads)
    assert all(g.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert np.isfinite(float(loss))


def test_cls_token_adds_one_position_and_learned_positions_shape():
    model = SequenceClassifier(_config(pooling="cls", positional="learned"), rngs=nnx.Rngs(0))
    chex.assert_shape(model.encoder.embedding.position_table[...], (LENGTH + 1, 16))
    ids, mask = _tokens(8, [5])
    graphdef, state = nnx.split(model)
    out = jax.eval_shape(
        lambda s: nnx.merge(graphdef, s).encoder(ids, mask, deterministic=True), state
    )
    assert out.shape == (1, LENGTH + 1, 16)


def test_embed_init_std_sets_token_scale_and_leaves_positions_alone():
    # The small protocol's reference draws tokens like positions, N(0, 0.02); LRA's JAX code
    # draws tokens N(0, 1). 32 x 16 draws: the sample std is within 15% of the target.
    for std in (1.0, 0.02):
        model = SequenceClassifier(
            _config(positional="learned", embed_init_std=std, vocab_size=VOCAB),
            rngs=nnx.Rngs(0))
        table = np.asarray(model.encoder.embedding.embed.embedding[...])
        positions = np.asarray(model.encoder.embedding.position_table[...])
        assert abs(table.std() / std - 1.0) < 0.15
        assert abs(positions.std() / 0.02 - 1.0) < 0.15
    for bad in (0.0, -0.02):
        with pytest.raises(ValueError, match=f"embed_init_std.*{bad}"):
            _config(embed_init_std=bad)


def test_bad_model_configuration_and_inputs():
    rngs = nnx.Rngs(0)
    with pytest.raises(ValueError, match="pooling.*'max'"):
        SequenceClassifier(_config(pooling="max"), rngs=rngs)
    with pytest.raises(ValueError, match="interaction.*'dot'"):
        DualEncoderClassifier(_config(interaction="dot"), rngs=rngs)
    with pytest.raises(ValueError, match="positional.*'rotary'"):
        SequenceClassifier(_config(positional="rotary"), rngs=rngs)
    with pytest.raises(ValueError, match="Unknown attention 'flash'.*softmax"):
        SequenceClassifier(_config("flash"), rngs=rngs)
    with pytest.raises(ValueError, match="num_heads.*num_heads=3"):
        SequenceClassifier(_config(num_heads=3), rngs=rngs)
    model = SequenceClassifier(_config(), rngs=rngs)
    ids, mask = _tokens(9, [16], total=LENGTH + 1)
    with pytest.raises(ValueError, match="max_length=16.*17"):
        model(ids, mask, deterministic=True)
    ids, mask = _tokens(9, [16])
    with pytest.raises(TypeError, match="mask must be bool"):
        model(ids, mask.astype(jnp.int32), deterministic=True)
    with pytest.raises(TypeError, match="integer"):
        model(ids.astype(jnp.float32), mask, deterministic=True)
    dual = DualEncoderClassifier(_config(), rngs=rngs)
    with pytest.raises(ValueError, match=r"\(batch, 2, length\)"):
        dual(ids, mask, deterministic=True)
    linformer = SequenceClassifier(
        _config("linformer", attention_kwargs=(("proj_len", 4), ("max_length", 8))), rngs=rngs
    )
    with pytest.raises(ValueError, match="max_length.*8.*kv_len=16"):
        linformer(ids, mask, deterministic=True)


def test_classifiers_derive_the_mask_from_the_padding_id():
    config = TransformerConfig(vocab_size=10, num_classes=3, max_length=8, dropout_rate=0.0,
                               embed_dim=8, qkv_dim=8, mlp_dim=8, num_layers=1)
    tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]])
    model = SequenceClassifier(config, rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(model(tokens), model(tokens, tokens > 0, deterministic=True))
    dual = DualEncoderClassifier(config, rngs=nnx.Rngs(0))
    pairs = jnp.stack([tokens, tokens[::-1]], axis=1)
    chex.assert_trees_all_equal(dual(pairs), dual(pairs, pairs > 0, deterministic=True))
    with pytest.raises(ValueError, match="deterministic must be given.*dropout_rate=0.1"):
        SequenceClassifier(TransformerConfig(vocab_size=10, num_classes=3, max_length=8),
                           rngs=nnx.Rngs(0))(tokens)


def test_encoder_hands_lunas_p_from_block_to_block():
    config = TransformerConfig(vocab_size=12, num_classes=2, max_length=8, num_layers=2,
                               embed_dim=8, num_heads=2, qkv_dim=8, mlp_dim=8, dropout_rate=0.0,
                               attention="luna", attention_kwargs=(("packed_length", 3),))
    encoder = TransformerEncoder(config, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(3), (2, 8), 1, 12)
    mask = jnp.arange(8)[None, :] < jnp.array([[8], [6]])
    got = encoder(ids, mask, deterministic=True)
    pairwise = mask[:, None, :, None] & mask[:, None, None, :]
    x = encoder.embedding(ids, deterministic=True)
    block0, block1 = encoder.layers
    assert isinstance(block0, EncoderBlock)
    x, carry = block0(x, pairwise, deterministic=True, return_carry=True)
    with_carry = encoder.norm(block1(x, pairwise, deterministic=True, carry=carry))
    without = encoder.norm(block1(x, pairwise, deterministic=True))
    chex.assert_trees_all_close(got, with_carry, atol=1e-5)
    assert float(jnp.abs(got - without).max()) > 1e-4
