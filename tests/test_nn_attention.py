"""spectral_jax.nn.MultiHeadAttention: method state, options and configuration errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from spectral_jax import attention
from spectral_jax.nn import (
    LengthProjectionState,
    MultiHeadAttention,
    RandomFeatures,
    redraw_features,
)

B, L, E, H = 2, 8, 8, 2
D = E // H


@nnx.jit(static_argnames="deterministic")
def _call(layer, x, mask=None, deterministic=True):
    # Jitted: one compile is several times faster than eager op-by-op for these methods.
    return layer(x, mask=mask, deterministic=deterministic)


def _inputs(seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, L, E))


def _padding_mask(lengths: tuple[int, ...]) -> jax.Array:
    valid = jnp.arange(L)[None, :] < jnp.array(lengths)[:, None]
    return nnx.make_attention_mask(valid, valid, dtype=jnp.bool_)


def _expected_softmax(layer: MultiHeadAttention, x: jax.Array, mask: jax.Array) -> np.ndarray:
    """Multi-head softmax attention written out in float64 numpy from the layer's weights."""
    p = {k: np.asarray(v, np.float64) for k, v in (
        ("wq", layer.query.kernel[...]), ("bq", layer.query.bias[...]),
        ("wk", layer.key.kernel[...] if layer.key is not None else layer.query.kernel[...]),
        ("bk", layer.key.bias[...] if layer.key is not None else layer.query.bias[...]),
        ("wv", layer.value.kernel[...]), ("bv", layer.value.bias[...]),
        ("wo", layer.out.kernel[...]), ("bo", layer.out.bias[...]))}
    x = np.asarray(x, np.float64)
    q = np.einsum("ble,ehd->blhd", x, p["wq"]) + p["bq"]
    k = np.einsum("ble,ehd->blhd", x, p["wk"]) + p["bk"]
    v = np.einsum("ble,ehd->blhd", x, p["wv"]) + p["bv"]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    logits = np.where(np.asarray(mask), logits, -1e30)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    y = np.einsum("bhqk,bkhd->bqhd", w, v)
    return np.einsum("bqhd,hde->bqe", y, p["wo"]) + p["bo"]


def test_softmax_layer_matches_handwritten_multihead_attention():
    layer = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    x, mask = _inputs(), _padding_mask((8, 5))
    out = _call(layer, x, mask=mask, deterministic=True)
    expected = _expected_softmax(layer, x, mask)
    np.testing.assert_allclose(np.asarray(out)[1, :5], expected[1, :5], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out)[0], expected[0], rtol=1e-4, atol=1e-5)


def test_symmetric_shares_query_and_key_projection():
    sym = MultiHeadAttention(
        H, E, attention="softmax", attention_kwargs={"symmetric": True}, rngs=nnx.Rngs(0)
    )
    assert sym.key is None
    full = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(1))
    n_sym = sum(x.size for x in jax.tree.leaves(nnx.state(sym, nnx.Param)))
    n_full = sum(x.size for x in jax.tree.leaves(nnx.state(full, nnx.Param)))
    assert n_full - n_sym == E * E + E  # one (E, H, D) kernel and its bias fewer
    x, mask = _inputs(), _padding_mask((8, 8))
    # Handwritten reference with K = X W_Q + b_Q.
    np.testing.assert_allclose(
        np.asarray(_call(sym, x, mask=mask, deterministic=True)),
        _expected_softmax(sym, x, mask),
        rtol=1e-4,
        atol=1e-5,
    )


def test_causal_softmax_ignores_future_inputs():
    layer = MultiHeadAttention(H, E, attention="softmax", is_causal=True, rngs=nnx.Rngs(0))
    x = _inputs()
    changed = x.at[:, 5:].set(100.0)
    a = _call(layer, x, deterministic=True)
    b = _call(layer, changed, deterministic=True)
    chex.assert_trees_all_equal(a[:, :5], b[:, :5])
    assert float(jnp.abs(a[:, 5:] - b[:, 5:]).max()) > 1e-3


def test_conv_skip_matches_numpy_depthwise_convolution():
    layer = MultiHeadAttention(
        H, E, attention="nystrom",
        attention_kwargs={"num_landmarks": 4, "conv_kernel_size": 3}, rngs=nnx.Rngs(0),
    )
    chex.assert_shape(layer.conv_skip.kernel[...], (3, 1, H))
    value = np.asarray(jax.random.normal(jax.random.key(1), (B, L, H, D)))
    valid = np.arange(L)[None, :] < np.array([[8], [6]])
    mask = jnp.asarray(valid[:, None, :, None] & valid[:, None, None, :])
    got = layer.conv_skip(jnp.asarray(value), mask, L)
    kernel = np.asarray(layer.conv_skip.kernel[...])[:, 0, :]  # (3, H)
    masked = value * valid[:, :, None, None]
    padded = np.pad(masked, ((0, 0), (1, 1), (0, 0), (0, 0)))
    # Cross-correlation (as lax.conv): y[t] = sum_j w[j] x[t + j - 1].
    expected = sum(kernel[j][None, None, :, None] * padded[:, j : j + L] for j in range(3))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


def test_conv_skip_changes_output_and_must_be_odd():
    kwargs = {"num_landmarks": 4}
    plain = MultiHeadAttention(H, E, attention="nystrom", attention_kwargs=kwargs,
                               rngs=nnx.Rngs(0))
    conv = MultiHeadAttention(H, E, attention="nystrom",
                              attention_kwargs={**kwargs, "conv_kernel_size": 3},
                              rngs=nnx.Rngs(0))
    off = MultiHeadAttention(H, E, attention="nystrom",
                             attention_kwargs={**kwargs, "conv_kernel_size": None},
                             rngs=nnx.Rngs(0))
    assert off.conv_skip is None
    x = _inputs()
    chex.assert_trees_all_equal(_call(off, x), _call(plain, x))
    nnx.update(conv, nnx.state(plain))  # same projections, conv kernel kept
    diff = _call(conv, x) - _call(plain, x)
    expected = conv.out(conv.conv_skip(conv.value(x), None, L)) - conv.out.bias[...]
    np.testing.assert_allclose(np.asarray(diff), np.asarray(expected), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="conv_kernel_size.*odd.*4"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"conv_kernel_size": 4},
                           rngs=nnx.Rngs(0))


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


def test_softmax_attention_dropout():
    layer = MultiHeadAttention(H, E, attention="softmax", dropout_rate=0.5, rngs=nnx.Rngs(0))
    plain = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    x = _inputs()
    chex.assert_trees_all_close(
        _call(layer, x), _call(plain, x), rtol=1e-6, atol=1e-6
    )
    assert float(jnp.abs(_call(layer, x, deterministic=False) - _call(plain, x)).max()) > 1e-3


def test_softmax_dropout_training_path_keeps_scale_causality_and_padding():
    # A vanishing rate: training must match evaluation, attention_kwargs (scale) included.
    kw = dict(attention="softmax", attention_kwargs={"scale": 0.01}, rngs=nnx.Rngs(0))
    layer = MultiHeadAttention(H, E, dropout_rate=1e-9, **kw)
    x = _inputs()
    valid = jnp.arange(L)[None, :] < jnp.array([[5], [L]])
    mask = nnx.make_attention_mask(valid, valid)
    train = _call(layer, x, mask, deterministic=False)
    chex.assert_trees_all_close(train, _call(layer, x, mask), atol=1e-5)
    # Causal cross-attention (q_len 8, kv_len 12) trains as it evaluates.
    cross = MultiHeadAttention(H, E, attention="softmax", dropout_rate=1e-9, is_causal=True,
                               rngs=nnx.Rngs(0))
    kv = jax.random.normal(jax.random.key(5), (B, 12, E))
    run = nnx.jit(lambda m, d: m(x, kv, deterministic=d), static_argnums=1)
    chex.assert_trees_all_close(run(cross, False), run(cross, True), atol=1e-5)


def test_bad_configuration_errors():
    rngs = nnx.Rngs(0)
    with pytest.raises(ValueError, match="not_a_method") as err:
        MultiHeadAttention(H, E, attention="not_a_method", rngs=rngs)
    for name in attention.available_attentions():
        assert name in str(err.value)
    with pytest.raises(ValueError, match="num_heads.*qkv_features=8.*num_heads=3"):
        MultiHeadAttention(3, E, attention="softmax", rngs=rngs)
    with pytest.raises(NotImplementedError, match="nystrom"):
        MultiHeadAttention(H, E, attention="nystrom", is_causal=True, rngs=rngs)
    with pytest.raises(ValueError, match="num_landmark.*allowed"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"num_landmark": 4},
                           rngs=rngs)
    with pytest.raises(ValueError, match="'projection'"):
        MultiHeadAttention(H, E, attention="performer",
                           attention_kwargs={"projection": jnp.ones((4, D))}, rngs=rngs)
    with pytest.raises(ValueError, match="num_features.*performer.*'nystrom'"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"num_features": 4},
                           rngs=rngs)
    with pytest.raises(ValueError, match="dropout_rate.*'nystrom'"):
        MultiHeadAttention(H, E, attention="nystrom", dropout_rate=0.1, rngs=rngs)
    with pytest.raises(ValueError, match=r"attention_kwargs\['key_value_seq_lengths'\] is per-call"):
        MultiHeadAttention(H, E, attention="nystrom",
                           attention_kwargs={"key_value_seq_lengths": jnp.array([3, 3])}, rngs=rngs)
    with pytest.raises(ValueError, match=r"`attention_kwargs\['head_chunk_size'\]` must be a positive int; got 0"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"head_chunk_size": 0},
                           rngs=rngs)
    with pytest.raises(ValueError, match="max_length"):
        MultiHeadAttention(H, E, attention="linformer", rngs=rngs)
    with pytest.raises(ValueError, match="sharing.*'headwise'"):
        MultiHeadAttention(H, E, attention="linformer",
                           attention_kwargs={"max_length": L, "sharing": "headwise"}, rngs=rngs)
    layer = MultiHeadAttention(H, E, attention="linformer",
                               attention_kwargs={"max_length": 4, "proj_len": 2}, rngs=rngs)
    with pytest.raises(ValueError, match="max_length.*4.*kv_len=8"):
        _call(layer, _inputs(), deterministic=True)
    random = MultiHeadAttention(H, E, attention="skyformer", rngs=rngs)
    with pytest.raises(ValueError, match="deterministic must be given.*'skyformer'"):
        random(_inputs())
