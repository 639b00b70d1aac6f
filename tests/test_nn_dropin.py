"""Drop-in proof: every pure attention function as Flax's ``attention_fn`` (NNX and Linen)."""

from __future__ import annotations

import functools

import attention_cases
import chex
import jax
import jax.numpy as jnp
import pytest
from flax import linen, nnx

from spectral_jax import attention

B, L, E, H = 2, 16, 8, 2
D = E // H


def _bound_fn(name: str):
    """The registered function with the parameters and state a module would own, bound.

    Without the sampling key: a module passes one only in training, so these evaluation calls
    use the sampling methods' fixed, padding-independent choice.
    """
    kwargs = attention_cases.method_kwargs(name, n=L, head_dim=D)
    kwargs.pop("rng", None)
    return functools.partial(attention.get_attention(name), **kwargs)


def _inputs() -> tuple[jax.Array, jax.Array]:
    """Row 1 is row 0 with its last 6 (padded) positions replaced by large values."""
    x = jax.random.normal(jax.random.key(0), (1, L, E))
    junk = 50.0 * jax.random.normal(jax.random.key(1), (1, L, E))
    valid = jnp.arange(L) < 10
    x = jnp.concatenate([x, jnp.where(valid[None, :, None], x, junk)], axis=0)
    return x, jnp.broadcast_to(valid, (B, L))


@nnx.jit
def _nnx_apply(layer, x, mask):
    return layer(x, mask=mask, deterministic=True)


@nnx.jit(static_argnums=(0, 4))
def _nnx_apply_and_expected(fn, layer, x, mask, is_causal=False):
    """The layer's output, and Flax's projections around ``fn`` written out by hand."""
    q, k, v = layer.query(x), layer.key(x), layer.value(x)
    return (layer(x, mask=mask, deterministic=True, is_causal=is_causal),
            layer.out(fn(q, k, v, mask=mask, is_causal=is_causal)))


@pytest.mark.parametrize("name", attention.available_attentions())
def test_pure_function_in_nnx_multihead_attention(name):
    fn = _bound_fn(name)
    layer = nnx.MultiHeadAttention(
        num_heads=H, in_features=E, qkv_features=E, decode=False, attention_fn=fn,
        rngs=nnx.Rngs(0),
    )
    x, valid = _inputs()
    mask = nnx.make_attention_mask(valid, valid, dtype=jnp.bool_)
    # A causal-only method (gated_linear) is called causally, as Flax's is_causal passes it.
    causal = attention.get_attention_spec(name).causal_only
    out, expected = _nnx_apply_and_expected(fn, layer, x, mask, causal)
    chex.assert_shape(out, (B, L, E))
    chex.assert_trees_all_close(out, expected, rtol=1e-4, atol=1e-5)
    # Padded content does not reach valid positions.
    chex.assert_trees_all_close(out[0, :10], out[1, :10], rtol=1e-5, atol=1e-5)
    if name == "softmax":
        default = nnx.MultiHeadAttention(
            num_heads=H, in_features=E, qkv_features=E, decode=False, rngs=nnx.Rngs(0)
        )
        chex.assert_trees_all_close(
            out[:, :10], _nnx_apply(default, x, mask)[:, :10], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("name", ["softmax", "nystrom", "performer"])
def test_pure_function_in_linen_multihead_dot_product_attention(name):
    fn = _bound_fn(name)
    layer = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, attention_fn=fn)
    x, valid = _inputs()
    mask = linen.make_attention_mask(valid, valid, dtype=jnp.bool_)
    variables = jax.jit(layer.init)(jax.random.key(0), x, mask=mask)
    out = jax.jit(layer.apply)(variables, x, mask=mask)
    chex.assert_shape(out, (B, L, E))
    chex.assert_trees_all_close(out[0, :10], out[1, :10], rtol=1e-5, atol=1e-5)
    if name == "softmax":
        default = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E)
        expected = jax.jit(default.apply)(variables, x, mask=mask)
        chex.assert_trees_all_close(out[:, :10], expected[:, :10], rtol=1e-5, atol=1e-6)
