"""Inducing points (Set Transformer) and Luna: attention through a summary of the keys,
against the two-step float64 formula.

Each function is checked against an independent numpy float64 implementation of its
formula, with padding, and for the library's guarantees: padded content never reaches a
valid output, padded queries give zeros, a query with no valid key gives zeros with finite
gradients, examples do not depend on their batch, jit/grad/vmap and bf16 work.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from summary_cases import B, D, H, M, N
from summary_cases import inputs as _inputs
from summary_cases import pair_mask as _pair_mask

from spectral_jax.attention import inducing_points_attention, luna_attention, luna_pack

# ------------------------------------------------------------------ numpy float64 formulas


def _two_step_np(q, k, v, s, k_valid, scale):
    """H = softmax(s I Kᵀ) V over valid keys, out = softmax(s Q Hᵀ) H, one head."""
    h = ref.attention(s, k, v, scale, key_valid=k_valid[None, :])
    return ref.attention(q, h, h, scale), h


def _per_head(fn, *arrays, k_valid, q_valid, shared=None, **kw):
    """Applies a one-head numpy formula to (B, n, H, d) arrays; zero rows at padded queries."""
    outs, hs = [], []
    for b in range(B):
        ob, hb = [], []
        for h in range(H):
            extra = () if shared is None else (
                np.asarray(shared)[:, h] if shared.ndim == 3 else np.asarray(shared)[b, :, h],)
            out, summ = fn(*(np.asarray(a, np.float64)[b, :, h] for a in arrays), *extra,
                           k_valid[b], **kw)
            ob.append(np.where(q_valid[b][:, None], out, 0.0))
            hb.append(summ)
        outs.append(np.stack(ob, 1))
        hs.append(None if hb[0] is None else np.stack(hb, 1))
    return np.stack(outs), None if hs[0] is None else np.stack(hs)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


SUMMARY = ("inducing_points", "luna")


@functools.partial(jax.jit, static_argnames=("name",))
def _summary(q, k, v, s, mask, lengths, *, name):
    """One compiled call per method, shape and dtype: always a mask, lengths and P'."""
    kw = dict(mask=mask, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    if name == "inducing_points":
        return inducing_points_attention(q, k, v, inducing_points=s, **kw), s
    return luna_attention(q, k, v, packed_query=s, return_packed=True, **kw)


def _full(q):
    return jnp.ones((q.shape[0], 1, q.shape[1], q.shape[1]), bool), jnp.full(q.shape[0], q.shape[1])


# ------------------------------------------------------------------ inducing points and Luna


@pytest.mark.parametrize(("name", "batched_summary"),
                         [("inducing_points", False), ("luna", False), ("luna", True)])
def test_summary_attention_matches_two_step_formula_with_padding(x64, name, batched_summary):
    q, k, v, points, _ = _inputs()
    if batched_summary:  # a previous Luna layer's P' is per example
        points = jax.random.normal(jax.random.key(7), (B, M, H, D), jnp.float64)
    valid = np.arange(N)[None, :] < np.array([[N], [8]])
    expected, summary = _per_head(_two_step_np, q, k, v, shared=points, k_valid=valid,
                                  q_valid=valid, scale=1 / np.sqrt(D))
    out, packed = _summary(q, k, v, points, _pair_mask(valid), _full(q)[1], name=name)
    chex.assert_trees_all_close(np.asarray(out), expected, atol=1e-12)
    if name == "luna":  # padded keys never reach P': it equals the valid-keys formula
        chex.assert_trees_all_close(np.asarray(packed), summary, atol=1e-12)


def test_summary_hand_computed_value_and_luna_pack(x64):
    # One point at 0 reads the keys uniformly: H = mean(v) = 2; then every query reads H = 2.
    k = jnp.zeros((1, 2, 1, 1))
    v = jnp.array([[[[1.0]], [[3.0]]]])
    q = jnp.ones((1, 3, 1, 1))
    out = inducing_points_attention(q, k, v, inducing_points=jnp.zeros((1, 1, 1)))
    np.testing.assert_allclose(np.asarray(out).ravel(), [2.0, 2.0, 2.0], rtol=1e-12)
    packed = luna_pack(q, k, v, packed_query=jnp.zeros((1, 1, 1)), mask=jnp.array([True, False]))
    np.testing.assert_allclose(np.asarray(packed).ravel(), [1.0], rtol=1e-12)


@pytest.mark.parametrize("name", SUMMARY)
def test_summary_padding_batch_vmap_and_grads(name):
    q, k, v, points, _ = _inputs(1, jnp.float32)
    valid = np.arange(N)[None, :] < np.array([[9], [N]])
    noise = 100 * jax.random.normal(jax.random.key(3), (3, B, N, H, D))
    pad = ~jnp.asarray(valid)[:, :, None, None]
    lengths = jnp.array([9, N])
    mask, full_lengths = _full(q)
    clean = _summary(*(jnp.where(pad, 0.0, x) for x in (q, k, v)), points, mask, lengths,
                     name=name)
    dirty = _summary(*(jnp.where(pad, e, x) for x, e in zip((q, k, v), noise)), points, mask,
                     lengths, name=name)
    chex.assert_trees_all_close(clean, dirty, atol=1e-6)
    assert float(jnp.abs(dirty[0][0, 9:]).max()) == 0.0  # padded query rows are zero
    by_mask = _summary(q, k, v, points, _pair_mask(valid), full_lengths, name=name)
    chex.assert_trees_all_close(by_mask, clean, atol=1e-5)
    # An example never depends on its batch; an outer vmap gives the same.
    alone = _summary(q[:1], k[:1], v[:1], points, mask[:1], lengths[:1], name=name)
    chex.assert_trees_all_close(alone[0], clean[0][:1], atol=1e-6)
    mapped = jax.vmap(lambda a, b, c, m, n: _summary(a, b, c, points, m, n, name=name))(
        q[:, None], k[:, None], v[:, None], mask[:, None], lengths[:, None])
    chex.assert_trees_all_close(mapped[0][:, 0], clean[0], atol=1e-5)
    # Example 0 has no valid key: zeros, and finite gradients for everything.
    none = jnp.array([0, N])
    out = _summary(q, k, v, points, mask, none, name=name)[0]
    assert float(jnp.abs(out[0]).max()) == 0.0 and float(jnp.abs(out[1]).min()) > 0.0
    loss = lambda *a: _summary(*a, mask, none, name=name)[0].sum()  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, points)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    assert float(jnp.abs(grads[3]).max()) > 0.0  # the inducing points / P are learnable


@pytest.mark.parametrize("name", SUMMARY)
def test_summary_bf16(name):
    bf = [x.astype(jnp.bfloat16) for x in _inputs(3, jnp.float32)[:4]]
    out16 = _summary(*bf, *_full(bf[0]), name=name)
    assert out16[0].dtype == out16[1].dtype == jnp.bfloat16
    out32 = _summary(*(x.astype(jnp.float32) for x in bf), *_full(bf[0]), name=name)
    chex.assert_trees_all_close(out16[0].astype(jnp.float32), out32[0], atol=2e-2)


@pytest.mark.parametrize("name", SUMMARY)
def test_summary_bad_arguments(name):
    q, k, v, points, _ = _inputs(0, jnp.float32)
    param = "inducing_points" if name == "inducing_points" else "packed_query"

    def fn(q, k, v, s, **kw):
        if name == "inducing_points":
            return inducing_points_attention(q, k, v, inducing_points=s, **kw)
        return luna_attention(q, k, v, packed_query=s, **kw)

    with pytest.raises(NotImplementedError, match="is_causal"):
        fn(q, k, v, points, is_causal=True)
    with pytest.raises(ValueError, match=param):
        fn(q, k, v, points[..., :3])
    with pytest.raises(ValueError, match=param):
        fn(q, k, v, jnp.zeros((3, M, H, D)))
    with pytest.raises(ValueError, match="value"):
        fn(q, k, v[..., :3], points)
    with pytest.raises(ValueError, match="bias"):
        fn(q, k, v, points, bias=jnp.zeros((B, H, N, N)))
    with pytest.raises(TypeError, match=param):
        fn(q, k, v, points.astype(jnp.int32))
    if name == "luna":
        with pytest.raises(TypeError, match="return_packed"):
            luna_attention(q, k, v, packed_query=points, return_packed=1)
