"""Module state of the survey-II methods: inducing points, Luna's carried P, RFA-Gate gates."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import attention
from spectral_jax.nn import (
    EncoderBlock,
    MultiHeadAttention,
    TransformerConfig,
    TransformerEncoder,
    sinusoidal_positions,
)

B, L, E, H = 2, 8, 8, 2
D = E // H


def _inputs(seed: int = 0) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(seed), (B, L, E))
    valid = jnp.arange(L)[None, :] < jnp.array([[L], [5]])
    return x, valid


def _np(x):
    return np.asarray(x, np.float64)


def _project(dense, x):
    """A LinearGeneral (in, heads, dim) applied in float64 numpy."""
    return np.einsum("...e,ehd->...hd", _np(x), _np(dense.kernel[...])) + _np(dense.bias[...])


def _attend(q, k, v, k_valid):
    """softmax(q kᵀ/√D) v per head over valid keys, float64: (..., n, h, d)."""
    logits = np.einsum("...qhd,...khd->...hqk", q, k) / np.sqrt(D)
    logits = np.where(k_valid[..., None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    return np.einsum("...hqk,...khd->...qhd", w, v)


def _out(layer, y):
    return np.einsum("bqhd,hde->bqe", y, _np(layer.out.kernel[...])) + _np(layer.out.bias[...])


def test_inducing_points_layer_is_the_two_step_formula_in_float64():
    layer = MultiHeadAttention(H, E, attention="inducing_points",
                               attention_kwargs={"num_inducing_points": 3}, rngs=nnx.Rngs(0))
    assert isinstance(layer.state.points, nnx.Param)
    chex.assert_shape(layer.state.points[...], (3, H, D))
    x, valid = _inputs()
    out = layer(x, mask=nnx.make_attention_mask(valid, valid), deterministic=True)
    q, k, v = (_project(p, x) for p in (layer.query, layer.key, layer.value))
    points = np.broadcast_to(_np(layer.state.points[...]), (B, 3, H, D))
    summary = _attend(points, k, v, np.asarray(valid))  # padded keys never reach H
    expected = _out(layer, _attend(q, summary, summary, np.ones((B, 3), bool)))
    sel = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(out)[sel], expected[sel], rtol=1e-4, atol=1e-5)


def test_gates_are_a_sigmoid_of_the_block_input_and_causal_is_required():
    with pytest.raises(NotImplementedError, match="causal only"):
        MultiHeadAttention(H, E, attention="gated_linear", rngs=nnx.Rngs(0))
    layer = MultiHeadAttention(H, E, attention="gated_linear", is_causal=True, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(np.asarray(layer.state.gate.bias[...]), 2.0)
    x, _ = _inputs(1)
    gates = jax.nn.sigmoid(x @ layer.state.gate.kernel[...] + layer.state.gate.bias[...])
    chex.assert_trees_all_close(layer.state(kv_len=L, deterministic=True, inputs=x)["gates"],
                                gates, atol=1e-6)
    q, k, v = layer.query(x), layer.key(x), layer.value(x)
    expected = layer.out(attention.gated_linear_attention(q, k, v, gates=gates))
    chex.assert_trees_all_close(layer(x, deterministic=True), expected, atol=1e-5)
    # The future never reaches the past: the gates are per position too.
    later = layer(x.at[:, 5:].set(9.0), deterministic=True)
    chex.assert_trees_all_close(later[:, :5], expected[:, :5], atol=1e-5)


def _luna_expected(layer, x, carry):
    """(out, next P) by hand: P = learned + positions or carry, pack/unpack, residual."""
    state = layer.state
    p = carry if carry is not None else state.packed[...] + sinusoidal_positions(3, E)
    pq = state.query(state.norm(p))
    q, k, v = layer.query(x), layer.key(x), layer.value(x)
    y, packed = attention.luna_attention(q, k, v, packed_query=pq, return_packed=True)
    return layer.out(y), p + state.out(packed)


def test_luna_layer_returns_the_next_p_and_uses_a_carried_one():
    layer = MultiHeadAttention(H, E, attention="luna", attention_kwargs={"packed_length": 3},
                               rngs=nnx.Rngs(0))
    x, _ = _inputs(2)
    out, p1 = layer(x, deterministic=True, return_carry=True)
    chex.assert_shape(p1, (B, 3, E))
    exp_out, exp_p1 = _luna_expected(layer, x, None)
    chex.assert_trees_all_close((out, p1), (exp_out, exp_p1), atol=1e-5)
    chex.assert_trees_all_close(layer(x, deterministic=True), out)  # the plain call
    carried = layer(x, deterministic=True, carry=p1)
    chex.assert_trees_all_close(carried, _luna_expected(layer, x, p1)[0], atol=1e-5)
    assert float(jnp.abs(carried - out).max()) > 1e-4
    with pytest.raises(ValueError, match="packed_length=3"):
        layer(x, deterministic=True, carry=p1[:, :2])
    other = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="has none"):
        other(x, deterministic=True, carry=p1)
    assert other(x, deterministic=True, return_carry=True)[1] is None


def test_encoder_hands_lunas_p_from_block_to_block():
    config = TransformerConfig(vocab_size=12, num_classes=2, max_length=L, num_layers=2,
                               embed_dim=E, num_heads=H, qkv_dim=E, mlp_dim=8, dropout_rate=0.0,
                               attention="luna", attention_kwargs=(("packed_length", 3),))
    encoder = TransformerEncoder(config, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(3), (B, L), 1, 12)
    mask = jnp.arange(L)[None, :] < jnp.array([[L], [6]])
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


def _n_params(module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@pytest.mark.parametrize("symmetric", ["pairwise", "pairwise_psd"])
def test_pairwise_symmetric_scores_are_q_sigma_qt_in_float64(symmetric):
    layer = MultiHeadAttention(H, E, attention="softmax",
                               attention_kwargs={"symmetric": symmetric}, rngs=nnx.Rngs(0))
    full = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    assert layer.key is None
    # No key projection (E·E + E), one d×d matrix per head instead.
    assert _n_params(full) - _n_params(layer) == E * E + E - H * D * D
    x, valid = _inputs(4)
    out = layer(x, mask=nnx.make_attention_mask(valid, valid), deterministic=True)
    q, v = _project(layer.query, x), _project(layer.value, x)
    m = _np(layer.pairwise.matrix[...])
    sigma = m @ np.swapaxes(m, -1, -2) if symmetric == "pairwise_psd" else m
    if symmetric == "pairwise_psd":
        np.testing.assert_allclose(sigma, np.swapaxes(sigma, -1, -2), atol=1e-12)
        assert np.linalg.eigvalsh(sigma).min() > -1e-12
    logits = np.einsum("bqhd,hde,bkhe->bhqk", q, sigma, q) / np.sqrt(D)
    logits = np.where(np.asarray(valid)[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    expected = _out(layer, np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), v))
    sel = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(out)[sel], expected[sel], rtol=1e-4, atol=1e-5)


_SMALL = {"linformer": {"max_length": L, "proj_len": 4}, "luna": {"packed_length": 3},
          "inducing_points": {"num_inducing_points": 3}, "performer": {"num_features": 8},
          "nystrom": {"num_landmarks": 4}, "spectral_shift": {"num_landmarks": 4},
          "skyformer": {"num_landmarks": 4}}


@pytest.mark.parametrize("name", attention.available_attentions())
def test_pairwise_symmetric_reaches_every_method(name):
    spec = attention.get_attention_spec(name)
    layer = MultiHeadAttention(H, E, attention=name, is_causal=spec.causal_only,
                               attention_kwargs={**_SMALL.get(name, {}), "symmetric": "pairwise"},
                               rngs=nnx.Rngs(0))
    x, _ = _inputs(5)
    shared = layer.query(x)
    q, k = layer.pairwise(shared, shared)
    kwargs = dict(layer.attention_kwargs)
    if spec.causal_only:
        kwargs["is_causal"] = True
    if layer.state is not None:
        kwargs.update(layer.state(kv_len=L, deterministic=True, inputs=x))
    expected = layer.out(spec.fn(q, k, layer.value(x), **kwargs))
    chex.assert_trees_all_close(layer(x, deterministic=True), expected, atol=1e-5, rtol=1e-5)
