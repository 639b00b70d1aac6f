"""Softmax over a subset or summary of the positions: clustered, improved clustered,
ProbSparse, memory-compressed and local attention.

Each against float64 NumPy: exact softmax at the limits where the method must be exact, and
its own formula away from them; error falling with the budget; padding-length independence,
tiny lengths, bad budgets and rng determinism. The library-wide properties (masks, padding,
transforms, bf16, causality) run in the registry-driven suite.
"""

from __future__ import annotations

import functools
import inspect
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import numpy_reference_sparse as sparse_ref
import pytest

from spectral_jax.attention import (
    clustered_attention,
    improved_clustered_attention,
    local_attention,
    memory_compressed_attention,
    probsparse_attention,
)
from spectral_jax.attention.sparse._clustered import kmeans_queries

B, N, H, D = 2, 24, 2, 8
SCALE = 1 / math.sqrt(D)
EYE = jnp.eye(D)[None]  # kernel = stride = 1, identity: memory compression does nothing


def _mean_pool(kernel):
    return jnp.broadcast_to(jnp.eye(D) / kernel, (kernel, D, D))


CONV3 = jax.random.normal(jax.random.key(77), (H, 3, D, D)) / np.sqrt(3 * D)
FNS = {
    "clustered": (clustered_attention, {"num_clusters": 4}),
    "improved_clustered": (improved_clustered_attention, {"num_clusters": 4, "topk": 4}),
    "probsparse": (probsparse_attention, {"factor": 1}),
    "memory_compressed": (memory_compressed_attention,
                          {"key_conv": CONV3, "value_conv": CONV3[0]}),
    "local": (local_attention, {"window": 3}),
}
NAMES = tuple(FNS)
CAUSAL = ("memory_compressed", "local")
RNG_METHODS = ("clustered", "improved_clustered", "probsparse")
# The budgets at which each method is exact softmax attention (for any n <= N).
EXACT = {
    "clustered": {"num_clusters": N},
    "improved_clustered": {"num_clusters": 2, "topk": N},
    "probsparse": {"factor": N},
    "memory_compressed": {"key_conv": EYE, "value_conv": EYE},
    "local": {"window": N},
}


STATIC = ("is_causal", "head_chunk_size", "num_clusters", "iterations", "topk", "factor",
          "stride", "window")


@functools.cache
def _jitted(name):
    # One compile per shape and budget: eager dispatch re-traces the k-means loop per call.
    fn = FNS[name][0]
    static = tuple(p for p in STATIC if p in inspect.signature(fn).parameters)
    return jax.jit(fn, static_argnames=static)


def _call(name, q, k, v, **extra):
    """The method at its test budget (``extra`` overrides), jitted."""
    return _jitted(name)(q, k, v, **(FNS[name][1] | extra))


def _eager(name, q, k, v, **extra):
    """Unjitted, for the checks that run on concrete values (argument and mask errors)."""
    return FNS[name][0](q, k, v, **(FNS[name][1] | extra))


def _qkv(seed, shape=(B, N, H, D), dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(k1, shape, dtype), jax.random.normal(k2, shape, dtype),
            jax.random.normal(k3, shape, dtype))


def _padding_mask(valid):
    return valid[:, None, :, None] & valid[:, None, None, :]


def _rel_err(approx, exact):
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def _per_head(fn, q, k, v, valid):
    """Applies a float64 (n, d) reference to every example and head; padded rows zero."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for b in range(q.shape[0]):
        idx = np.flatnonzero(valid[b])
        for h in range(q.shape[2]):
            out[b, idx, h] = fn(q[b, idx, h], k[b, idx, h], v[b, idx, h])
    return out


VALID = np.arange(N)[None, :] < np.array([[15], [N]])  # example 0: 15 tokens, then padding


# ------------------------------------------------------------------ exactness limits


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_exact_limit_is_softmax_attention(name, causal):
    if causal and name not in CAUSAL:
        pytest.skip("no causal form")
    q, k, v = _qkv(0)
    out = _jitted(name)(q, k, v, mask=_padding_mask(jnp.asarray(VALID)), is_causal=causal,
                        **EXACT[name])
    expected = _per_head(functools.partial(ref.attention, scale=SCALE, causal=causal),
                         q, k, v, VALID)
    chex.assert_trees_all_close(np.asarray(out, np.float64), expected, atol=2e-6, rtol=1e-5)


# ------------------------------------------------------- each formula in float64 NumPy


CONV_K = np.asarray(jax.random.normal(jax.random.key(5), (3, D, D))) / np.sqrt(3 * D)
CONV_V = np.asarray(jax.random.normal(jax.random.key(6), (3, D, D))) / np.sqrt(3 * D)
P = functools.partial
FORMULAS = [
    ("clustered", {"num_clusters": 3, "iterations": 4},
     P(sparse_ref.clustered, clusters=3, iterations=4, scale=SCALE)),
    ("improved_clustered", {"num_clusters": 3, "iterations": 4, "topk": 5},
     P(sparse_ref.clustered, clusters=3, iterations=4, topk=5, scale=SCALE)),
    ("probsparse", {"factor": 2}, P(sparse_ref.probsparse, factor=2, scale=SCALE)),
    ("memory_compressed", {"key_conv": CONV_K, "value_conv": CONV_V},
     P(sparse_ref.memory_compressed, wk=CONV_K, wv=CONV_V, stride=3, causal=False,
       scale=SCALE)),
    ("memory_compressed", {"key_conv": CONV_K, "value_conv": CONV_V, "stride": 2,
                           "is_causal": True},
     P(sparse_ref.memory_compressed, wk=CONV_K, wv=CONV_V, stride=2, causal=True,
       scale=SCALE)),
    ("local", {"window": 2}, P(sparse_ref.band, window=2, causal=False, scale=SCALE)),
    ("local", {"window": 5, "is_causal": True},
     P(sparse_ref.band, window=5, causal=True, scale=SCALE)),
]


@pytest.mark.parametrize("name,kwargs,formula", FORMULAS)
def test_matches_float64_formula_away_from_the_limit(name, kwargs, formula):
    q, k, v = _qkv(1)
    out = _jitted(name)(q, k, v, mask=_padding_mask(jnp.asarray(VALID)), **kwargs)
    chex.assert_trees_all_close(np.asarray(out, np.float64), _per_head(formula, q, k, v, VALID),
                                atol=1e-5, rtol=1e-5)


def test_kmeans_assignment_matches_float64():
    q = np.asarray(jax.random.normal(jax.random.key(3), (N, D)))
    kmeans = jax.jit(kmeans_queries, static_argnums=(2, 3))
    cent, a = kmeans(jnp.asarray(q), jnp.ones(N, bool), 4, 6)
    cent64, a64 = sparse_ref.kmeans(q.astype(np.float64), 4, 6)
    np.testing.assert_array_equal(np.asarray(a), a64)
    chex.assert_trees_all_close(np.asarray(cent, np.float64), cent64, atol=1e-6)


# ------------------------------------------------------------- error falls with budget


# Budgets below each method's exact limit; EXACT, shared with the test above, comes last.
BUDGETS = {  # the first of each (but memory_compressed's) shares a compile with FORMULAS
    "clustered": [{"num_clusters": 3, "iterations": 4}, {"num_clusters": 8}],
    "improved_clustered": [{"num_clusters": 3, "iterations": 4, "topk": 5},
                           {"num_clusters": 3, "iterations": 4, "topk": 10}],
    "probsparse": [{"factor": 2}, {"factor": 4}],
    "memory_compressed": [{"key_conv": _mean_pool(s), "value_conv": _mean_pool(s)}
                          for s in (6, 2)],
    "local": [{"window": 2}, {"window": 4}],
}


@pytest.mark.parametrize("name", NAMES)
def test_error_falls_as_the_budget_grows(name):
    # Locally correlated tokens, so that neighbours (local, compressed memory) and clusters
    # carry information. Same shapes and mask as the exactness test: one compile less.
    q, k = (jnp.cumsum(0.4 * x, axis=1) for x in _qkv(2)[:2])
    v = _qkv(3)[2]
    mask = _padding_mask(jnp.asarray(VALID))
    exact = _per_head(functools.partial(ref.attention, scale=SCALE), q, k, v, VALID)
    errs = [_rel_err(_jitted(name)(q, k, v, mask=mask, **kw), exact)
            for kw in BUDGETS[name] + [EXACT[name]]]
    assert errs[0] > 0.05, errs  # the smallest budget is a real approximation
    assert errs[1] < errs[0] and errs[2] < 1e-5, errs


# ------------------------------------------------------------ padding and length
# Masks, padding, batch independence, transforms, bf16, causality and bias/mask rejection
# are the registry-driven tests' (test_attention_properties.py), at each entry's test_budget.


@pytest.mark.parametrize("name", NAMES)
def test_output_does_not_depend_on_how_far_the_example_is_padded(name):
    # 10 valid tokens padded to N or to 16: the valid outputs agree, for any budget
    # (clusters, top-u, slots and blocks are all taken over the valid tokens).
    q, k, v = (jnp.where(jnp.arange(N)[:, None, None] < 10, x, 3.0) for x in _qkv(8))
    lengths = jnp.full((B,), 10)
    long = _call(name, q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    short = _call(name, q[:, :16], k[:, :16], v[:, :16], query_seq_lengths=lengths,
                  key_value_seq_lengths=lengths)
    chex.assert_trees_all_close(short[:, :10], long[:, :10], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(long[:, 10:]), 0.0)


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("name", NAMES)
def test_any_length_with_any_budget(name, n):
    # Budgets above n (e.g. 4 clusters at n = 1) and exactness at n = 5.
    q, k, v = _qkv(9, (1, n, H, D))
    kw = FNS[name][1] if n == 1 else EXACT[name]
    out = _jitted(name)(q, k, v, **kw)
    expected = _per_head(functools.partial(ref.attention, scale=SCALE), q, k, v,
                         np.ones((1, n), bool))
    if n == 1 and name == "memory_compressed":
        expected = None  # one slot of conv(k), not the key itself
    if expected is not None:
        chex.assert_trees_all_close(np.asarray(out, np.float64), expected, atol=1e-5)
    assert np.isfinite(np.asarray(out)).all()


# ----------------------------------------------------------------- bad arguments


BAD = [
    ("clustered", "num_clusters"), ("clustered", "iterations"),
    ("improved_clustered", "num_clusters"), ("improved_clustered", "topk"),
    ("probsparse", "factor"), ("memory_compressed", "stride"), ("local", "window"),
]


@pytest.mark.parametrize("name,param", BAD)
def test_bad_budgets_name_the_parameter(name, param):
    q, k, v = _qkv(12, (1, 8, H, D))
    bad = (-1, 1.5, True, "4") if param == "iterations" else (0, -1, 1.5, True, "4")
    for value in bad:
        # Wrong kinds ("4") are TypeErrors, bad values ValueErrors (spectral_jax._checks).
        with pytest.raises((ValueError, TypeError), match=param):
            _eager(name, q, k, v, **{param: value})


def test_memory_compressed_weights_are_checked():
    q, k, v = _qkv(13, (1, 8, H, D))
    with pytest.raises(ValueError, match="key_conv"):
        memory_compressed_attention(q, k, v, value_conv=EYE)
    with pytest.raises(ValueError, match="value_conv"):
        memory_compressed_attention(q, k, v, key_conv=EYE, value_conv=jnp.ones((1, D, 3)))
    with pytest.raises(ValueError, match="kernel"):
        memory_compressed_attention(q, k, v, key_conv=EYE, value_conv=_mean_pool(3))
    with pytest.raises(ValueError, match="q_len"):
        memory_compressed_attention(q, k[:, :5], v[:, :5], key_conv=EYE, value_conv=EYE,
                                    is_causal=True)
    with pytest.raises(ValueError, match="q_len"):
        local_attention(q, k[:, :5], v[:, :5], causal_alignment="bottom_right")


@pytest.mark.parametrize("name", RNG_METHODS)
def test_rng_methods_are_deterministic_given_the_rng(name):
    q, k, v = _qkv(15)
    first = _call(name, q, k, v, rng=jax.random.key(3))
    chex.assert_trees_all_equal(_call(name, q, k, v, rng=jax.random.key(3)), first)
    assert float(jnp.abs(_call(name, q, k, v, rng=jax.random.key(4)) - first).max()) > 1e-4
    # One key per example and head, by fold_in: example 0 ignores example 1.
    other = [x.at[1].multiply(10.0) for x in (q, k, v)]
    chex.assert_trees_all_close(_call(name, *other, rng=jax.random.key(3))[0], first[0],
                                atol=2e-5, rtol=2e-5)
    with pytest.raises(TypeError, match="rng"):
        _eager(name, q, k, v, rng=jax.random.split(jax.random.key(3), 2))
