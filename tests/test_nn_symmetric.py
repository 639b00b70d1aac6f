"""Symmetric attention in spectral_jax.nn.MultiHeadAttention: a shared query/key projection
(scores Q Qᵀ) and the pairwise variants Q Σ_h Qᵀ, in float64 and through every method."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import attention
from spectral_jax.nn import MultiHeadAttention

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


def _out(layer, y):
    return np.einsum("bqhd,hde->bqe", y, _np(layer.out.kernel[...])) + _np(layer.out.bias[...])


def _n_params(module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def test_symmetric_shares_query_and_key_projection():
    sym = MultiHeadAttention(
        H, E, attention="softmax", attention_kwargs={"symmetric": True}, rngs=nnx.Rngs(0)
    )
    assert sym.key is None
    full = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(1))
    assert _n_params(full) - _n_params(sym) == E * E + E  # one (E, H, D) kernel and bias fewer
    x, valid = _inputs()
    # Handwritten reference with K = X W_Q + b_Q.
    q, v = _project(sym.query, x), _project(sym.value, x)
    logits = np.einsum("bqhd,bkhd->bhqk", q, q) / np.sqrt(D)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    expected = _out(sym, np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), v))
    np.testing.assert_allclose(np.asarray(sym(x, deterministic=True)), expected, rtol=1e-4,
                               atol=1e-5)


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
# The recurrent family's paper layer (short convolution, output norm and gate) off, so that
# the module is the projections around the method, as the by-hand reference computes it.
_PLAIN_LAYER = {True: {"short_conv_size": None, "output_gate": None}}

@pytest.mark.parametrize("name", attention.available_attentions())
def test_pairwise_symmetric_reaches_every_method(name):
    spec = attention.get_attention_spec(name)
    layer = MultiHeadAttention(H, E, attention=name, is_causal=spec.causal_only,
                               attention_kwargs={**_SMALL.get(name, {}), "symmetric": "pairwise",
                                                 **_PLAIN_LAYER.get(bool(spec.layer), {})},
                               rngs=nnx.Rngs(0))
    x, _ = _inputs(5)

    @nnx.jit
    def by_hand(layer, x):  # jitted, as the module's call below: one program each
        shared = layer.query(x)
        q, k = layer.pairwise(shared, shared)
        kwargs = dict(layer.attention_kwargs)
        if spec.causal_only:
            kwargs["is_causal"] = True
        if layer.state is not None:
            kwargs.update(layer.state(kv_len=L, deterministic=True, inputs=x))
        return layer.out(spec.fn(q, k, layer.value(x), **kwargs))

    got = nnx.jit(lambda layer, x: layer(x, deterministic=True))(layer, x)
    chex.assert_trees_all_close(got, by_hand(layer, x), atol=1e-5, rtol=1e-5)
