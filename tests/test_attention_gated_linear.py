"""Gated linear attention (RFA-Gate) against its explicit float64 recurrence.

It is checked against an independent numpy float64 implementation of its
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
import pytest
from summary_cases import B, D, H, N
from summary_cases import inputs as _inputs
from summary_cases import key_mask as _key_mask
from summary_cases import pair_mask as _pair_mask

from spectral_jax.attention import gated_linear_attention, linear_attention

# ------------------------------------------------------------------ numpy float64 formulas


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


def _elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _gated_np(q, k, v, g, k_valid, eps):
    """The explicit recurrence, token by token; padded keys skipped."""
    pq, pk = _elu1(q), _elu1(k)
    s, z = np.zeros((q.shape[1], v.shape[1])), np.zeros(q.shape[1])
    out = np.zeros((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        if k_valid[t]:
            s = g[t] * s + (1 - g[t]) * np.outer(pk[t], v[t])
            z = g[t] * z + (1 - g[t]) * pk[t]
        den = pq[t] @ z + eps
        out[t] = pq[t] @ s / den if den > 0 else 0.0
    return out, None


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _full(q):
    return jnp.ones((q.shape[0], 1, q.shape[1], q.shape[1]), bool), jnp.full(q.shape[0], q.shape[1])


# ------------------------------------------------------------------ gated linear attention


@functools.partial(jax.jit, static_argnames=("chunk_size", "eps"))
def _gated(q, k, v, gates, mask, *, chunk_size=4, eps=1e-6):
    return gated_linear_attention(q, k, v, gates=gates, mask=mask, chunk_size=chunk_size, eps=eps)


@pytest.mark.parametrize("chunk_size", [4, 64])
def test_gated_matches_explicit_recurrence_with_padding(x64, chunk_size):
    q, k, v, _, gates = _inputs(4)
    # Example 0: the first key and two in the middle padded; example 1: right padding.
    valid = np.ones((B, N), bool)
    valid[0, [0, 5, 6]] = False
    valid[1, 10:] = False
    gates = gates.at[0, 2].set(0.0).at[1, 3].set(1.0)  # a reset and a step that keeps all
    expected, _ = _per_head(_gated_np, q, k, v, gates, k_valid=valid,
                            q_valid=np.ones((B, N), bool), eps=1e-6)
    out = _gated(q, k, v, gates, _key_mask(valid), chunk_size=chunk_size)
    chex.assert_trees_all_close(np.asarray(out), expected, atol=1e-10)
    assert float(jnp.abs(out[0, 0]).max()) == 0.0  # no valid key at or before query 0


def test_gated_limits(x64):
    q, k, v, _, _ = _inputs(5)
    mask = _full(q)[0]
    # g -> 1: the (1 - g) factors cancel in the ratio: causal linear attention (eps = 0).
    near_one = jnp.full((B, N, H), 1.0 - 1e-9)
    out = _gated(q, k, v, near_one, mask, eps=0.0)
    lin = linear_attention(q, k, v, is_causal=True, eps=0.0, chunk_size=4)
    chex.assert_trees_all_close(out, lin, atol=1e-6)
    # g = 0: the state is the current token alone, so y_t = v_t exactly.
    chex.assert_trees_all_close(_gated(q, k, v, 0 * near_one, mask, eps=0.0), v, atol=1e-12)


def test_gated_padding_causality_batch_vmap_and_grads():
    q, k, v, _, gates = _inputs(6, jnp.float32)
    valid = np.arange(N)[None, :] < np.array([[9], [N]])
    pad = ~jnp.asarray(valid)[:, :, None, None]
    noise = 100 * jax.random.normal(jax.random.key(8), (3, B, N, H, D))
    mask = _pair_mask(valid)
    clean = _gated(q, k, v, gates, mask)
    dirty = _gated(*(jnp.where(pad, e, x) for x, e in zip((q, k, v), noise)),
                   jnp.where(pad[..., 0], 0.0, gates), mask)
    chex.assert_trees_all_close(clean, dirty, atol=1e-6)
    assert float(jnp.abs(clean[0, 9:]).max()) == 0.0
    # Causal: changing token 7's key, value and gate leaves queries 0..6 unchanged.
    full = _full(q)[0]
    base = _gated(q, k, v, gates, full)
    moved = _gated(q, k.at[:, 7].add(3.0), v.at[:, 7].add(3.0), gates.at[:, 7].set(0.01), full)
    chex.assert_trees_all_close(moved[:, :7], base[:, :7], atol=1e-6)
    assert float(jnp.abs(moved[:, 7:] - base[:, 7:]).max()) > 1e-3
    # Batch independence and an outer vmap.
    chex.assert_trees_all_close(_gated(q[:1], k[:1], v[:1], gates[:1], full[:1]), base[:1],
                                atol=1e-6)
    mapped = jax.vmap(_gated)(q[:, None], k[:, None], v[:, None], gates[:, None], full[:, None])
    chex.assert_trees_all_close(mapped[:, 0], base, atol=1e-5)
    # No valid key at all in example 0: zeros and finite gradients, also for the gates.
    none = _key_mask(jnp.zeros((B, N), bool).at[1].set(True))
    assert float(jnp.abs(_gated(q, k, v, gates, none)[0]).max()) == 0.0
    grads = jax.jit(jax.grad(lambda *a: _gated(*a, none).sum(), argnums=(0, 1, 2, 3)))(
        q, k, v, gates)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    assert float(jnp.abs(grads[3][1]).max()) > 0.0


def test_gated_bf16():
    bf = [x.astype(jnp.bfloat16) for x in _inputs(7, jnp.float32)]
    bf = bf[:3] + bf[4:]
    mask = _full(bf[0])[0]
    out16 = _gated(*bf, mask)
    assert out16.dtype == jnp.bfloat16
    out32 = _gated(*(x.astype(jnp.float32) for x in bf), mask)
    chex.assert_trees_all_close(out16.astype(jnp.float32), out32, atol=2e-2)


def test_gated_bad_arguments():
    q, k, v, _, gates = _inputs(0, jnp.float32)
    with pytest.raises(NotImplementedError, match="is_causal"):
        gated_linear_attention(q, k, v, gates=gates, is_causal=False)
    with pytest.raises(ValueError, match="gates"):
        gated_linear_attention(q, k, v, gates=gates[:, :5])
    with pytest.raises(ValueError, match="gates"):
        gated_linear_attention(q, k, v, gates=gates.at[0, 0, 0].set(1.5))
    with pytest.raises(TypeError, match="gates"):
        gated_linear_attention(q, k, v, gates=(gates > 0.5).astype(jnp.int32))
    with pytest.raises(ValueError, match="scale"):
        gated_linear_attention(q, k, v, gates=gates, scale=0.5)
    with pytest.raises(ValueError, match="chunk_size"):
        gated_linear_attention(q, k, v, gates=gates, chunk_size=0)
    with pytest.raises(ValueError, match="eps"):
        gated_linear_attention(q, k, v, gates=gates, eps=-1.0)
    with pytest.raises(ValueError, match="q_len == kv_len"):
        gated_linear_attention(q[:, :5], k, v, gates=gates)
