"""Kernel feature methods against their exact formulas in float64: linear attention, Performer
(FAVOR+ and its orthogonal features) and Linformer, at the limits where they must be exact.

Inputs: ``attention_cases.qkv64``, as in ``tests/test_attention_exact.py``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_cases import jitted, one_head, qkv64, rel_err

from spectral_jax import attention as sa


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_matches_formula(causal):
    q, k, v = qkv64(17, (1, 50, 1, 8))
    out = jitted(sa.linear_attention, is_causal=causal, chunk_size=16)(q, k, v)  # 16 ∤ 50
    expected = ref.linear_attention(one_head(q), one_head(k), one_head(v), causal)
    np.testing.assert_allclose(one_head(out), expected, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_matches_favor_formula(causal):
    q, k, v = qkv64(18, (1, 40, 1, 8))
    w = sa.orthogonal_random_features(jax.random.key(0), 24, 8, dtype=jnp.float64)
    out = jitted(sa.performer_attention, is_causal=causal, chunk_size=16)(q, k, v, projection=w)
    c = 8**-0.25
    wn = np.asarray(w)

    def feats(x):  # unstabilised positive features; stabilisers cancel exactly when eps = 0
        x = x * c
        return np.exp(x @ wn.T - 0.5 * (x * x).sum(-1, keepdims=True))

    a = feats(one_head(q)) @ feats(one_head(k)).T
    if causal:
        a = np.tril(a)
    expected = (a @ one_head(v)) / a.sum(-1, keepdims=True)
    tol = 1e-10 if causal else 1e-4  # the bidirectional form adds eps = 1e-6 to every feature
    np.testing.assert_allclose(one_head(out), expected, rtol=tol, atol=tol)


def test_performer_error_falls_with_features():
    q, k, v = (0.5 * x for x in qkv64(19, (1, 128, 1, 16), step=0.2))
    exact = jitted(sa.reference_attention)(q, k, v)
    means = []
    for r in (8, 64, 512):
        features = jitted(sa.orthogonal_random_features, num_features=r, head_dim=16,
                          dtype=jnp.float64)
        errs = [
            rel_err(
                jitted(sa.performer_attention)(q, k, v, projection=features(jax.random.key(s))),
                exact,
            )
            for s in range(4)
        ]
        means.append(np.mean(errs))
    assert means == sorted(means, reverse=True) and means[-1] < 0.5 * means[0], means


def test_orthogonal_features_are_orthogonal_within_blocks():
    w = np.asarray(sa.orthogonal_random_features(jax.random.key(1), 20, 8, scaling="sqrt_d"))
    np.testing.assert_allclose(w[:8] @ w[:8].T, 8 * np.eye(8), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(w, axis=1), np.sqrt(8), rtol=1e-5)


def test_linformer_identity_projection_is_exact_and_short_inputs_use_first_columns():
    q, k, v = qkv64(20, (1, 48, 1, 8))
    linformer = jitted(sa.linformer_attention)
    chex.assert_trees_all_close(
        linformer(q, k, v, key_projection=jnp.eye(48, dtype=jnp.float64)),
        jitted(sa.reference_attention)(q, k, v),
        atol=1e-10,
    )
    e = jax.random.normal(jax.random.key(1), (16, 64), jnp.float64)  # max_length 64 > 48
    valid = np.arange(48) < 40
    mask = jnp.asarray(valid)[None, None, :, None] & jnp.asarray(valid)[None, None, None, :]
    out = linformer(q, k, v, mask=mask, key_projection=e)
    en = np.asarray(e)[:, :48]
    kk, vv = one_head(k) * valid[:, None], one_head(v) * valid[:, None]
    expected = ref.softmax(one_head(q) @ (en @ kk).T / np.sqrt(8)) @ (en @ vv)
    expected[~valid] = 0
    np.testing.assert_allclose(one_head(out), expected, atol=1e-10)
    with pytest.raises(ValueError, match="max_length=64"):
        sa.linformer_attention(*(jnp.ones((1, 65, 1, 8)),) * 3, key_projection=e)


def test_orthogonal_features_are_unbiased_gaussian_marginals():
    # Each feature is uniform on the sphere times a chi_d norm, i.e. marginally N(0, I):
    # coordinate means near 0 and E[exp(w·x)] = exp(|x|²/2). QR without the sign fix gave
    # means of about -0.09 and 1.21 for 1.43 here.
    w = np.asarray(sa.orthogonal_random_features(jax.random.key(0), 65536, 8), np.float64)
    assert np.abs(w.mean(0)).max() < 0.02  # standard error 1/256
    x = np.full(8, 0.3)
    np.testing.assert_allclose(np.exp(w @ x).mean(), np.exp(0.5 * x @ x), rtol=0.02)


def test_performer_converges_to_softmax_with_many_features():
    q, k, v = (
        s * jax.random.normal(key, (1, 16, 1, 8), jnp.float64)
        for s, key in zip((0.5, 0.5, 1.0), jax.random.split(jax.random.key(21), 3))
    )
    exact = jitted(sa.reference_attention)(q, k, v)
    features = jitted(sa.orthogonal_random_features, num_features=65536, head_dim=8,
                      dtype=jnp.float64)
    errs = [
        rel_err(jitted(sa.performer_attention)(q, k, v, projection=features(jax.random.key(s))),
                exact)
        for s in range(2)
    ]
    # Biased features stalled at about 0.08 here whatever the number of features.
    assert max(errs) < 0.02, errs
