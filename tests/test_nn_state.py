"""State modules of spectral_jax.nn.MultiHeadAttention: random features, length projections,
sampling streams, memory-compression weights, inducing points, Luna's carried P, RFA-Gate gates."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from layer_cases import B, D, E, H, L
from layer_cases import call as _call
from layer_cases import inputs as _inputs
from layer_cases import padding_mask as _padding_mask

from spectral_jax import attention
from spectral_jax.nn import (
    LengthProjectionState,
    MemoryConvState,
    MultiHeadAttention,
    RandomFeatures,
    redraw_features,
    sinusoidal_positions,
)


def _valid() -> jax.Array:
    """(B, L) bool: row 0 full, row 1 with 5 valid tokens."""
    return jnp.arange(L)[None, :] < jnp.array([[L], [5]])


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


def test_performer_projection_is_random_features_not_param_and_redraws_explicitly():
    layer = MultiHeadAttention(
        H, E, attention="performer", attention_kwargs={"num_features": 16}, rngs=nnx.Rngs(0)
    )
    assert isinstance(layer.state.projection, RandomFeatures)
    assert not isinstance(layer.state.projection, nnx.Param)
    chex.assert_shape(layer.state.projection[...], (16, D))
    assert layer.state.projection[...].dtype == jnp.float32
    params = nnx.state(layer, nnx.Param)
    assert all("projection" not in path for path, _ in nnx.to_flat_state(params))
    # The optimizer's gradient tree has no entry for the projection.
    opt = nnx.Optimizer(layer, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
        grads = nnx.grad(lambda m: jnp.sum(m(_inputs(), deterministic=True) ** 2))(model)
        opt.update(model, grads)

    before = layer.state.projection[...]
    step(layer, opt)
    chex.assert_trees_all_equal(layer.state.projection[...], before)

    x = _inputs()
    first = _call(layer, x, deterministic=False)
    chex.assert_trees_all_equal(_call(layer, x, deterministic=False), first)  # never implicit
    layer.redraw(jax.random.key(7))
    expected = attention.orthogonal_random_features(jax.random.key(7), 16, D)
    chex.assert_trees_all_equal(layer.state.projection[...], expected)
    assert float(jnp.abs(_call(layer, x, deterministic=True) - first).max()) > 0

def test_redraw_features_counts_and_skips_other_methods():
    class Two(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            kw = {"num_features": 8}
            self.a = MultiHeadAttention(H, E, attention="performer", attention_kwargs=kw,
                                        rngs=rngs)
            self.b = MultiHeadAttention(H, E, attention="performer", attention_kwargs=kw,
                                        rngs=rngs)
            self.c = MultiHeadAttention(H, E, attention="softmax", rngs=rngs)

    model = Two(nnx.Rngs(0))
    assert redraw_features(model, jax.random.key(3)) == 2
    chex.assert_trees_all_equal(
        model.a.state.projection[...],
        attention.orthogonal_random_features(jax.random.fold_in(jax.random.key(3), 0), 8, D),
    )
    assert float(jnp.abs(model.a.state.projection[...] - model.b.state.projection[...]).max()) > 0
    assert redraw_features(model.c, jax.random.key(3)) == 0
    with pytest.raises(ValueError, match="performer.*'softmax'"):
        model.c.redraw(jax.random.key(0))

def test_skyformer_eval_is_bitwise_deterministic_and_training_samples():
    layer = MultiHeadAttention(
        H, E, attention="skyformer", attention_kwargs={"num_landmarks": 4}, rngs=nnx.Rngs(0)
    )
    x, mask = _inputs(), _padding_mask((8, 6))
    a = _call(layer, x, mask=mask, deterministic=True)
    b = _call(layer, x, mask=mask, deterministic=True)
    chex.assert_trees_all_equal(a, b)
    t1 = _call(layer, x, mask=mask, deterministic=False)
    t2 = _call(layer, x, mask=mask, deterministic=False)
    assert float(jnp.abs(t1 - t2).max()) > 0  # the landmark stream advances
    chex.assert_trees_all_equal(_call(layer, x, mask=mask, deterministic=True), a)

@pytest.mark.parametrize(
    "sharing, names",
    [("none", {"key_projection", "value_projection"}), ("key_value", {"key_projection"}),
     ("layerwise", set())],
)
def test_linformer_sharing_modes_own_the_right_projections(sharing, names):
    kw = {"proj_len": 4, "max_length": L, "sharing": sharing}
    shared = None
    if sharing == "layerwise":
        with pytest.raises(ValueError, match="shared_state"):
            MultiHeadAttention(H, E, attention="linformer", attention_kwargs=kw,
                               rngs=nnx.Rngs(0))
        shared = LengthProjectionState.shared(kw, rngs=nnx.Rngs(1))
    layer = MultiHeadAttention(H, E, attention="linformer", attention_kwargs=kw,
                               shared_state=shared, rngs=nnx.Rngs(0))
    owned = {path[-1] for path, _ in nnx.to_flat_state(nnx.state(layer.state, nnx.Param))}
    if sharing == "layerwise":  # the layer uses the encoder's one instance, owns none
        assert layer.state is shared
        owned = set()
    assert owned & {"key_projection", "value_projection"} == names
    for name in names:
        chex.assert_shape(getattr(layer.state, name)[...], (4, L))
    x = _inputs()
    out = _call(layer, x, deterministic=True)
    chex.assert_shape(out, (B, L, E))
    assert bool(jnp.all(jnp.isfinite(out)))

def test_linformer_key_value_equals_none_with_equal_projections():
    kw = {"proj_len": 4, "max_length": L}
    kv = MultiHeadAttention(H, E, attention="linformer",
                            attention_kwargs={**kw, "sharing": "key_value"}, rngs=nnx.Rngs(0))
    none = MultiHeadAttention(H, E, attention="linformer",
                              attention_kwargs={**kw, "sharing": "none"}, rngs=nnx.Rngs(0))
    nnx.update(none, nnx.state(kv))
    none.state.value_projection[...] = kv.state.key_projection[...]
    x = _inputs()
    chex.assert_trees_all_close(
        _call(kv, x), _call(none, x), rtol=1e-6, atol=1e-6
    )


# The memory-compression and sampling tests run on 12 tokens (stride 1 and 3 both fit).
L12 = 12


def _x12(seed=0):
    return jax.random.normal(jax.random.key(seed), (B, L12, E))


def test_memory_conv_weights_are_learned_params_and_kernel_one_identity_is_softmax():
    layer = MultiHeadAttention(H, E, attention="memory_compressed",
                               attention_kwargs={"kernel_size": 1}, rngs=nnx.Rngs(0))
    assert isinstance(layer.state, MemoryConvState)
    chex.assert_shape(layer.state.key_conv[...], (H, 1, E // H, E // H))
    params = nnx.state(layer.state, nnx.Param)
    assert {p[-1] for p, _ in nnx.to_flat_state(params)} == {"key_conv", "value_conv"}
    # A gradient reaches both weights.
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(_x12(), deterministic=True) ** 2)))(layer)
    assert float(jnp.abs(grads.state.key_conv[...]).sum()) > 0
    assert float(jnp.abs(grads.state.value_conv[...]).sum()) > 0
    # Kernel = stride = 1 with identity weights: the softmax layer with the same projections.
    eye = jnp.broadcast_to(jnp.eye(E // H), (H, 1, E // H, E // H))
    layer.state.key_conv[...] = eye
    layer.state.value_conv[...] = eye
    softmax = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    valid = jnp.arange(L12)[None, :] < jnp.array([[7], [L12]])
    mask = nnx.make_attention_mask(valid, valid, dtype=jnp.bool_)
    run = nnx.jit(lambda m: m(_x12(), mask=mask, deterministic=True))
    chex.assert_trees_all_close(run(layer)[valid], run(softmax)[valid], atol=1e-5, rtol=1e-5)

def test_memory_conv_starts_near_mean_pooling_and_checks_kernel_size():
    state = MemoryConvState({"kernel_size": 3}, num_heads=H, head_dim=4, rngs=nnx.Rngs(0))
    pool = np.broadcast_to(np.eye(4) / 3, (H, 3, 4, 4))
    delta = np.asarray(state.key_conv[...]) - pool
    assert 0 < np.abs(delta).max() < 0.2  # a nudge off pooling, different per head
    assert np.abs(delta[0] - delta[1]).max() > 0
    with pytest.raises(ValueError, match=r"kernel_size.*0"):
        MemoryConvState({"kernel_size": 0}, num_heads=H, head_dim=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size.*'memory_compressed'"):
        MultiHeadAttention(H, E, attention="local", attention_kwargs={"kernel_size": 3},
                           rngs=nnx.Rngs(0))

@pytest.mark.parametrize("name", ["clustered", "probsparse"])
def test_sampling_methods_are_deterministic_in_evaluation_and_sample_in_training(name):
    layer = MultiHeadAttention(H, E, attention=name,
                               attention_kwargs={"num_clusters": 3} if name == "clustered"
                               else {"factor": 1}, rngs=nnx.Rngs(0))
    run = nnx.jit(lambda m, x, d: m(x, deterministic=d), static_argnums=2)
    x = _x12(1)
    a, b = run(layer, x, True), run(layer, x, True)
    chex.assert_trees_all_equal(a, b)
    t1, t2 = run(layer, x, False), run(layer, x, False)
    assert float(jnp.abs(t1 - t2).max()) > 0  # the sampling stream advances
    chex.assert_trees_all_equal(run(layer, x, True), a)


def test_inducing_points_layer_is_the_two_step_formula_in_float64():
    layer = MultiHeadAttention(H, E, attention="inducing_points",
                               attention_kwargs={"num_inducing_points": 3}, rngs=nnx.Rngs(0))
    assert isinstance(layer.state.points, nnx.Param)
    chex.assert_shape(layer.state.points[...], (3, H, D))
    x, valid = _inputs(), _valid()
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
    x = _inputs(1)
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
    x = _inputs(2)
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
