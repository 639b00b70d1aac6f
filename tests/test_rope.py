"""Rotary position embeddings: the rotation against float64 numpy, the relative-position
property of exact attention, bf16, errors, and RoPE through MultiHeadAttention for every
registered method and through the models' ``positional="rope"``."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UsageError, UsageTypeError, attention
from spectral_jax.nn import (
    MultiHeadAttention,
    SequenceClassifier,
    TokenEmbedding,
    TransformerConfig,
    apply_rope,
    rotary_embedding,
)

B, L, E, H = 2, 8, 8, 2
D = E // H


def rope_reference(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoFormer eq. 34 in float64, one 2x2 rotation matrix per feature pair (i, i + d/2)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        angle = np.asarray(positions, np.float64) * base ** (-2.0 * i / d)  # (..., length)
        c, s = np.cos(angle)[..., None], np.sin(angle)[..., None]  # one per position
        rotation = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)
        pair = np.stack([x[..., i], x[..., i + d // 2]], -1)  # (..., length, heads, 2)
        rotated = np.einsum("...ij,...j->...i", rotation, pair)
        out[..., i], out[..., i + d // 2] = rotated[..., 0], rotated[..., 1]
    return out


def _qk(seed: int = 0, shape=(2, 16, 2, 8), dtype=jnp.float32):
    kq, kk = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kq, shape, dtype), jax.random.normal(kk, shape, dtype)


def test_rotation_matches_float64_reference_and_keeps_norms():
    q, _ = _qk()
    positions = np.arange(16) * 3 + 5
    got = np.asarray(apply_rope(q, positions))
    want = rope_reference(q, positions)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1),
                               np.linalg.norm(np.asarray(q, np.float64), axis=-1), rtol=1e-5)
    # Position 0 is the identity; None means arange(length).
    np.testing.assert_array_equal(np.asarray(apply_rope(q, np.zeros(16, int))), np.asarray(q))
    np.testing.assert_array_equal(np.asarray(apply_rope(q)), np.asarray(apply_rope(q,
                                                                                  np.arange(16))))


@pytest.mark.parametrize("shift", [1, 7, 1000, 10**6, 2**31 - 16])
def test_exact_scores_and_attention_depend_on_relative_positions_only(shift):
    q, k = _qk(1)
    v = jax.random.normal(jax.random.key(2), q.shape)
    positions = np.arange(16)
    # float64 reference scores at positions 0..15.
    rq, rk = rope_reference(q, positions), rope_reference(k, positions)
    want = np.einsum("bqhd,bkhd->bhqk", rq, rk)
    # Every position moved by `shift`: the same scores, to float32 rounding; the integer
    # positions' angles are reduced modulo a turn exactly, so the error does not grow with
    # the shift (a float32 product p·θ would be off by ~0.1 rad at 10⁶).
    moved = positions + shift
    got = jnp.einsum("bqhd,bkhd->bhqk", apply_rope(q, moved), apply_rope(k, moved))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    # And the exact attention output with them.
    base = attention.softmax_attention(apply_rope(q, positions), apply_rope(k, positions), v)
    out = attention.softmax_attention(apply_rope(q, moved), apply_rope(k, moved), v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(base), atol=1e-4)
    # Without RoPE's relative structure (queries and keys moved differently) the scores change.
    apart = jnp.einsum("bqhd,bkhd->bhqk", apply_rope(q, moved), apply_rope(k, positions))
    assert np.abs(np.asarray(apart) - want).max() > 1e-2


def test_integer_positions_get_angles_exact_at_any_int32_value():
    positions = np.array([0, 1, 999, 10**6, 2**24 + 1, 2**30 + 12345, 2**31 - 1, -5, -10**6])
    cos, sin = rotary_embedding(jnp.asarray(positions, jnp.int32), 64)
    # Reference in extended precision: p·θ itself needs more than float64's 53 bits here.
    theta = np.longdouble(10000.0) ** (-np.arange(0, 64, 2, dtype=np.longdouble) / 64)
    angle = positions.astype(np.longdouble)[:, None] * theta
    np.testing.assert_allclose(np.asarray(cos), np.cos(angle).astype(np.float64), atol=2e-6)
    np.testing.assert_allclose(np.asarray(sin), np.sin(angle).astype(np.float64), atol=2e-6)
    # Float positions take the float32 product: close for small positions only.
    f_cos, _ = rotary_embedding(jnp.asarray(positions[:3], jnp.float32), 64)
    np.testing.assert_allclose(np.asarray(f_cos), np.asarray(cos[:3]), atol=1e-4)
    f_cos, _ = rotary_embedding(jnp.asarray(positions[3:4], jnp.float32), 64)
    assert np.abs(np.asarray(f_cos) - np.asarray(cos[3:4])).max() > 1e-2


def test_batched_positions_and_decode_step():
    q, _ = _qk(3)
    per_example = np.stack([np.arange(16), np.arange(16) + 4])
    got = np.asarray(apply_rope(q, per_example))
    np.testing.assert_allclose(got, rope_reference(q, per_example), atol=1e-5)
    # One query at cache index 9 is rotated as position 9 of a longer sequence.
    step = apply_rope(q[:, 9:10], np.array([9]))
    np.testing.assert_allclose(np.asarray(step), np.asarray(apply_rope(q))[:, 9:10], atol=1e-6)


def test_bfloat16_is_rotated_in_float32_and_close_to_float32():
    q, _ = _qk(4)
    got = apply_rope(q.astype(jnp.bfloat16), np.arange(16) + 500)
    assert got.dtype == jnp.bfloat16
    want = rope_reference(q.astype(jnp.bfloat16).astype(jnp.float32), np.arange(16) + 500)
    # One bf16 rounding of the result (8 bits of mantissa), no error growing with position.
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2 ** -7, atol=2 ** -7)
    cos, sin = rotary_embedding(jnp.arange(4), 8)
    assert cos.dtype == sin.dtype == jnp.float32 and cos.shape == (4, 4)


def test_errors_name_the_argument():
    with pytest.raises(UsageError, match="head_dim.*even"):
        apply_rope(jnp.ones((1, 4, 2, 5)))
    with pytest.raises(UsageError, match="positions.*length=4"):
        apply_rope(jnp.ones((1, 4, 2, 8)), np.arange(5))
    with pytest.raises(UsageError, match="x.*heads, head_dim"):
        apply_rope(jnp.ones((4, 8)))
    # Positions of another batch than x's: neither broadcast into x nor a raw shape error.
    with pytest.raises(UsageError, match=r"batch \(3,\) \(that of `x`\); got shape \(2, 4\)"):
        apply_rope(jnp.ones((3, 4, 2, 8)), np.zeros((2, 4), int))
    with pytest.raises(UsageError, match=r"batch \(1,\).*got shape \(3, 4\)"):
        apply_rope(jnp.ones((1, 4, 2, 8)), np.zeros((3, 4), int))
    with pytest.raises(UsageTypeError, match="float array.*int32"):
        apply_rope(jnp.ones((1, 4, 2, 8), jnp.int32))


def test_an_odd_head_dimension_is_refused_where_the_layer_or_model_is_built():
    # RoPE rotates pairs: qkv 6 over 2 heads is a head dimension of 3.
    with pytest.raises(UsageError, match=r"`qkv_features` / `num_heads` = 6 / 2 = 3 must be even"):
        MultiHeadAttention(2, 6, rope=True, rngs=nnx.Rngs(0))
    with pytest.raises(UsageError, match=r"`qkv_dim` / `num_heads` = 6 / 2 = 3 must be even"):
        TransformerConfig(vocab_size=5, num_classes=2, max_length=8, positional="rope",
                          qkv_dim=6, num_heads=2)
    with pytest.raises(UsageError, match=r"`model.qkv_dim` / `model.num_heads` = 66 / 2"):
        TransformerConfig.check_fields({"positional": "rope", "qkv_dim": 66, "num_heads": 2},
                                       owner="config", prefix="model.")
    TransformerConfig(vocab_size=5, num_classes=2, max_length=8, qkv_dim=6, num_heads=2)
    with pytest.raises(UsageTypeError, match="`rope` must be a bool"):
        MultiHeadAttention(2, 8, rope="yes", rngs=nnx.Rngs(0))


def test_positions_without_rope_are_refused_not_ignored():
    layer = MultiHeadAttention(2, 8, rngs=nnx.Rngs(0))
    with pytest.raises(UsageError, match="rope=False, so they would be ignored"):
        layer(jnp.ones((1, 4, 8)), positions=jnp.arange(4))


_SMALL = {"linformer": {"max_length": L, "proj_len": 4}, "luna": {"packed_length": 3},
          "inducing_points": {"num_inducing_points": 3}, "performer": {"num_features": 8},
          "nystrom": {"num_landmarks": 4}, "spectral_shift": {"num_landmarks": 4},
          "skyformer": {"num_landmarks": 4}}
# The recurrent family's paper layer (short convolution, output norm and gate) off, so that
# the module is the projections around the method, as the by-hand reference computes it.
_PLAIN_LAYER = {True: {"short_conv_size": None, "output_gate": None}}


@pytest.mark.parametrize("name", attention.available_attentions())
def test_every_method_gets_rotated_query_and_key_through_the_module(name):
    spec = attention.get_attention_spec(name)
    kw = dict(attention=name, is_causal=spec.causal_only,
              attention_kwargs={**_SMALL.get(name, {}), **_PLAIN_LAYER.get(bool(spec.layer), {})})
    layer = MultiHeadAttention(H, E, rope=True, rngs=nnx.Rngs(0), **kw)
    x = jax.random.normal(jax.random.key(5), (B, L, E))

    @nnx.jit
    def by_hand(layer, x):  # jitted, as the module's calls below: one program each
        kwargs = dict(layer.attention_kwargs)
        if spec.causal_only:
            kwargs["is_causal"] = True
        if layer.state is not None:
            kwargs.update(layer.state(kv_len=L, deterministic=True, inputs=x))
        q, k = apply_rope(layer.query(x)), apply_rope(layer.key(x))
        return layer.out(spec.fn(q, k, layer.value(x), **kwargs))

    call = nnx.jit(lambda layer, x: layer(x, deterministic=True))
    got = call(layer, x)
    chex.assert_trees_all_close(got, by_hand(layer, x), atol=1e-5, rtol=1e-5)
    # The same weights without RoPE give another output: the rotation reached the method.
    plain = MultiHeadAttention(H, E, rngs=nnx.Rngs(0), **kw)
    assert np.abs(np.asarray(call(plain, x)) - np.asarray(got)).max() > 1e-4


def _config(**kw):
    return TransformerConfig(vocab_size=10, num_classes=3, max_length=8, num_layers=1,
                             embed_dim=8, num_heads=2, qkv_dim=8, mlp_dim=16,
                             dropout_rate=0.0, **kw)


def test_rope_model_adds_no_position_vectors_and_rotates_in_every_layer():
    emb = TokenEmbedding(10, 8, 8, positional="rope", rngs=nnx.Rngs(0))
    tokens = jnp.array([[3, 4, 5, 3]])
    np.testing.assert_array_equal(np.asarray(emb(tokens, deterministic=True)),
                                  np.asarray(emb.embed(tokens)))
    assert emb.position_table is None
    model = SequenceClassifier(_config(positional="rope"), rngs=nnx.Rngs(0))
    assert all(layer.attention.rope for layer in model.encoder.layers)
    # Mean pooling with no positions is blind to order; RoPE is not.
    swapped = jnp.array([[4, 3, 5, 3]])
    for positional, differs in (("none", False), ("rope", True)):
        m = SequenceClassifier(_config(positional=positional), rngs=nnx.Rngs(0))
        gap = np.abs(np.asarray(m(tokens) - m(swapped))).max()
        assert (gap > 1e-5) == differs, (positional, gap)
