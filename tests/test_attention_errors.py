"""Bad input gets a clear error that names the parameter, the value and what is allowed."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import method_kwargs

from spectral_jax import attention as sa

X = jnp.ones((1, 16, 2, 8))


@functools.cache
def _kwargs(name: str) -> dict:
    """The method's parameters at 16 tokens, head_dim 8 (built once: its state is random)."""
    return method_kwargs(name, n=16, head_dim=8)


def _bound(name: str):
    return functools.partial(sa.get_attention(name), **_kwargs(name))


@functools.cache
def _jitted(name: str):
    """``(query, key, value, mask) -> output``, one jitted function per method, so the tests
    that call a method with the same shapes share one compilation."""
    fn = _bound(name)
    return jax.jit(lambda q, k, v, mask: fn(q, k, v, mask=mask))


def test_unknown_attention_name_lists_known_names():
    with pytest.raises(ValueError, match=r"'flash'.*softmax, nystrom, spectral_shift, skyformer"):
        sa.get_attention("flash")
    assert sa.available_attentions() == (
        "softmax", "nystrom", "spectral_shift", "skyformer", "kernelized", "linear",
        "performer", "linformer", "inducing_points", "luna", "gated_linear",
        "clustered", "improved_clustered", "probsparse", "memory_compressed", "local",
        "gla", "retnet", "mamba2", "deltanet", "gated_deltanet",
    )


@pytest.mark.parametrize(
    "fn", [sa.nystrom_attention, sa.spectral_shift_attention, sa.skyformer_attention]
)
@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_non_positive_num_landmarks(fn, bad):
    with pytest.raises(ValueError, match=rf"`num_landmarks` must be a positive int; got {bad!r}"):
        fn(X, X, X, num_landmarks=bad)


@pytest.mark.parametrize("name", sa.available_attentions())
def test_mismatched_head_dim_and_rank(name):
    fn = _bound(name)
    with pytest.raises(ValueError, match="head_dim differ: 8 vs 4"):
        fn(X, jnp.ones((1, 16, 2, 4)), X)
    with pytest.raises(
        ValueError, match=r"`query` must have shape \(batch..., length, heads, head_dim\)"
    ):
        fn(jnp.ones((16, 8)), X, X)
    with pytest.raises(TypeError, match="`key` must be a floating array; got dtype int32"):
        fn(X, jnp.ones((1, 16, 2, 8), jnp.int32), X)
    with pytest.raises(TypeError, match="`mask` must be boolean or numeric"):
        fn(X, X, X, mask=jnp.ones((1, 1, 16, 16), jnp.complex64))
    with pytest.raises(ValueError, match=r"`mask` of shape \(3, 1, 16, 16\) does not broadcast"):
        fn(X, X, X, mask=jnp.ones((3, 1, 16, 16), bool))


@pytest.mark.parametrize("name", sa.available_attentions())
def test_flax_float_masks_equal_boolean_masks(name):
    # flax.nnx.make_attention_mask returns float32 1/0 by default.
    import flax.nnx as nnx

    x = jax.random.normal(jax.random.key(0), (2, 16, 2, 8))
    valid = jnp.arange(16)[None, :] < jnp.array([[11], [16]])
    run = _jitted(name)
    as_float = run(x, x, x, nnx.make_attention_mask(valid, valid))
    as_bool = run(x, x, x, nnx.make_attention_mask(valid, valid, dtype=bool))
    assert bool(jnp.isfinite(as_bool).all())
    assert bool(jnp.array_equal(as_float, as_bool))


@pytest.mark.parametrize("name", [n for n, s in sa.ATTENTIONS.items() if not s.exact])
def test_traced_band_mask_is_never_silent_under_jit(name):
    # A banded mask traced under jit is not taken as padding (a causal mask would be, for a
    # method running causally: only the causal triangle is read): the example whose mask is
    # not a padding mask gets NaN outputs, the other one is untouched (equal to its output
    # when both masks are padding masks), and under checkify the error names the method
    # and the fault, while padding masks raise nothing.
    from jax.experimental import checkify

    x = jax.random.normal(jax.random.key(0), (2, 16, 2, 8))
    fn = _bound(name)
    run = _jitted(name)
    padding = jnp.ones((16, 16), bool).at[12:].set(False).at[:, 12:].set(False)
    band = jnp.abs(jnp.arange(16)[:, None] - jnp.arange(16)[None, :]) <= 2
    mixed = jnp.stack([padding, band])[:, None]
    both_padding = jnp.stack([padding, padding])[:, None]
    out, good = run(x, x, x, mixed), run(x, x, x, both_padding)
    assert bool(jnp.isnan(out[1]).all())
    assert bool(jnp.isfinite(good).all())
    chex.assert_trees_all_close(out[0], good[0], atol=1e-5)
    checked = jax.jit(checkify.checkify(lambda m: fn(x, x, x, mask=m)))
    error, _ = checked(mixed)
    with pytest.raises(
        checkify.JaxRuntimeError, match=rf"{fn.func.__name__}\(\): `mask` must be a padding mask"
    ):
        error.throw()
    error, _ = checked(both_padding)
    error.throw()  # no error for padding masks


def test_softmax_edge_inputs_get_clear_results():
    q = jax.random.normal(jax.random.key(1), (2, 16, 2, 8))
    v = jax.random.normal(jax.random.key(2), (2, 16, 2, 4))  # v_head_dim != head_dim
    out, ref = jax.jit(lambda q, v: (sa.softmax_attention(q, q, v),
                                     sa.reference_attention(q, q, v)))(q, v)
    assert out.shape == (2, 16, 2, 4)
    assert bool(jnp.allclose(out, ref, atol=1e-5))
    # Dtypes and shapes only: traced, not compiled.
    mixed = jax.eval_shape(sa.softmax_attention, q.astype(jnp.bfloat16), q, q)
    assert mixed.dtype == jnp.float32  # mixed dtypes promote
    scaled = jax.eval_shape(lambda q: sa.softmax_attention(q, q, q, scale=jnp.float32(0.5)), q)
    assert scaled.shape == q.shape
    with pytest.raises(ValueError, match=r"`mask` of shape \(3, 1, 16, 16\) does not broadcast"):
        sa.softmax_attention(q, q, q, mask=jnp.ones((3, 1, 16, 16), bool))
    with pytest.raises(ValueError, match=r"`bias` of shape"):
        sa.softmax_attention(q, q, q, bias=jnp.ones((2, 1, 16, 15)))


def test_method_specific_arguments():
    with pytest.raises(
        ValueError, match=r"`feature_map` must be one of \('elu', 'relu'\); got 'tanh'"
    ):
        sa.linear_attention(X, X, X, feature_map="tanh")
    with pytest.raises(ValueError, match="`scale` must be None"):
        sa.linear_attention(X, X, X, scale=0.5)
    with pytest.raises(
        ValueError, match="`projection` must be a \\(num_features, head_dim\\) array"
    ):
        sa.performer_attention(X, X, X)
    with pytest.raises(ValueError, match="`projection` has 4 columns but head_dim is 8"):
        sa.performer_attention(X, X, X, projection=jnp.ones((16, 4)))
    with pytest.raises(ValueError, match="`key_projection` must be"):
        sa.linformer_attention(X, X, X)
    with pytest.raises(ValueError, match="`pinv_iterations` must be a non-negative int"):
        sa.nystrom_attention(X, X, X, pinv_iterations=-1)
    with pytest.raises(ValueError, match=r"`pinv_init` must be one of \('per_matrix', 'global'\)"):
        sa.nystrom_attention(X, X, X, pinv_init="original")
    with pytest.raises(ValueError, match=r"`shift` must be one of"):
        sa.spectral_shift_attention(X, X, X, shift="big")
    with pytest.raises(ValueError, match="q_len == kv_len"):
        sa.spectral_shift_attention(
            X, jnp.ones((1, 32, 2, 8)), jnp.ones((1, 32, 2, 8)), num_landmarks=4
        )
    with pytest.raises(ValueError, match="`ridge` must be a finite float >= 0"):
        sa.skyformer_attention(X, X, X, ridge=-1.0)
    with pytest.raises(TypeError, match="`rng` must be one jax.random key"):
        sa.skyformer_attention(X, X, X, rng=3)
    with pytest.raises(ValueError, match="`scale` must be a positive float"):
        sa.softmax_attention(X, X, X, scale=-1.0)
    with pytest.raises(ValueError, match=r"does not broadcast"):
        sa.nystrom_attention(X, X, X, mask=jnp.ones((3, 16), bool))
    with pytest.raises(ValueError, match=r"`init` must be one of"):
        sa.iterative_pinv(jnp.eye(3), 2, init="x")
    with pytest.raises(ValueError, match=r"`matrix` must be square"):
        sa.iterative_pinv(jnp.ones((3, 2)))


def test_pinv_global_init_is_shared_over_batch_and_heads():
    # The "global" init couples examples (as the PyTorch references do); per_matrix does not.
    x = jax.random.normal(jax.random.key(0), (2, 64, 2, 8))
    y = x.at[1].multiply(20.0)
    both = jax.jit(lambda a: (sa.nystrom_attention(a, a, a, num_landmarks=8)[0],
                              sa.nystrom_attention(a, a, a, num_landmarks=8,
                                                   pinv_init="global")[0]))
    per, glob = zip(both(x), both(y))
    assert bool(jnp.array_equal(per[0], per[1]))
    assert not bool(jnp.allclose(glob[0], glob[1], atol=1e-6))


@pytest.mark.parametrize("name", [n for n in sa.available_attentions() if n != "softmax"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_head_chunk_size(name, bad):
    fn = _bound(name)
    with pytest.raises(
        ValueError, match=rf"`head_chunk_size` must be a positive int or None; got {bad!r}"
    ):
        fn(X, X, X, head_chunk_size=bad)
    if name in ("nystrom", "spectral_shift"):  # every token a landmark: the exact path
        with pytest.raises(ValueError, match=r"`head_chunk_size` must be a positive int or None"):
            fn(X, X, X, num_landmarks=16, head_chunk_size=bad)


@pytest.mark.parametrize("fn", [sa.nystrom_attention, sa.spectral_shift_attention])
def test_global_pinv_init_works_one_head_at_a_time(fn):
    # The global scale is computed before the per-head loop, so chunking changes nothing.
    x = jax.random.normal(jax.random.key(2), (2, 16, 2, 8))
    chunked, whole = jax.jit(lambda x: (
        fn(x, x, x, num_landmarks=4, pinv_init="global", head_chunk_size=1),
        fn(x, x, x, num_landmarks=4, pinv_init="global"),
    ))(x)
    chex.assert_trees_all_close(chunked, whole, atol=1e-6)


@pytest.mark.parametrize("name", sa.available_attentions())
def test_bad_seq_lengths(name):
    fn = _bound(name)
    with pytest.raises(
        TypeError, match="`key_value_seq_lengths` must be an integer array; got dtype float32"
    ):
        fn(X, X, X, key_value_seq_lengths=jnp.array([3.0]))
    with pytest.raises(
        ValueError, match=r"`query_seq_lengths` must have the batch shape \(1,\).*got shape \(2,\)"
    ):
        fn(X, X, X, query_seq_lengths=jnp.array([3, 4]))
    with pytest.raises(
        ValueError, match=r"`key_value_seq_lengths` must lie in \[0, 16\].*got values from 17 to 17"
    ):
        fn(X, X, X, key_value_seq_lengths=jnp.array([17]))


@pytest.mark.parametrize("name", sa.available_attentions())
def test_empty_sequences_and_non_bool_causal_flags_are_rejected(name):
    kw = _kwargs(name)
    fn = sa.get_attention(name)
    empty = jnp.ones((1, 0, 2, 8))
    with pytest.raises(ValueError, match=r"sequence lengths must be >= 1; got q_len=0"):
        fn(empty, X, X, **kw)
    with pytest.raises(TypeError, match=r"`is_causal` must be a bool; got 'yes'"):
        fn(X, X, X, is_causal="yes", **kw)
    with pytest.raises(TypeError, match=r"`mask` must be boolean or numeric.*<U1"):
        fn(X, X, X, mask=np.array(["a"] * 16), **kw)


def test_float_parameters_must_be_finite_and_integers_may_come_from_numpy():
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match=rf"`ridge` must be a finite float >= 0; got {bad!r}"):
            sa.skyformer_attention(X, X, X, num_landmarks=4, ridge=bad)
        with pytest.raises(ValueError, match=r"`eps` must be a finite float >= 0"):
            sa.linear_attention(X, X, X, eps=bad)
        with pytest.raises(ValueError, match=r"`eps` must be a finite float >= 0"):
            sa.performer_attention(X, X, X, projection=jnp.ones((4, 8)), eps=bad)
    # Values read from NumPy (configs, sweeps) behave like Python numbers.
    ref, same = jax.jit(lambda x: (
        sa.skyformer_attention(x, x, x, num_landmarks=4, ridge=0.1, pinv_iterations=3),
        sa.skyformer_attention(x, x, x, num_landmarks=np.int64(4), ridge=np.float32(0.1),
                               pinv_iterations=np.int64(3)),
    ))(X)
    assert jnp.allclose(ref, same)
    with pytest.raises(TypeError, match=r"`dtype` must be a float dtype"):
        sa.orthogonal_random_features(jax.random.key(0), 8, 8, dtype=jnp.int32)
    with pytest.raises(ValueError, match=r"`num_landmarks` must be a positive int; got 0"):
        sa.segment_means(jnp.ones((4, 2)), jnp.ones(4, bool), 0)


def test_skyformer_rng_must_be_one_key():
    keys = jax.random.split(jax.random.key(0), 2)
    for bad in (keys, jnp.ones(2, jnp.float32), jax.random.key_data(keys)):
        with pytest.raises(TypeError, match=r"`rng` must be one jax.random key"):
            sa.skyformer_attention(X, X, X, num_landmarks=4, rng=bad)
    # A raw uint32 key is accepted (traced, not compiled: the checks run in Python).
    out = jax.eval_shape(
        lambda x: sa.skyformer_attention(x, x, x, num_landmarks=4, rng=jax.random.PRNGKey(0)), X)
    assert (out.shape, out.dtype) == (X.shape, X.dtype)


@pytest.mark.parametrize("name", [n for n in sa.available_attentions() if n != "softmax"])
def test_attention_weight_dropout_is_refused_by_methods_without_weights(name):
    kw = _kwargs(name)
    fn = sa.get_attention(name)
    with pytest.raises(NotImplementedError, match=r"dropout is not implemented.*dropout_rate=0.1"):
        fn(X, X, X, dropout_rate=0.1, deterministic=False, dropout_rng=jax.random.key(0), **kw)
    # Evaluation mode, or a zero rate, is fine (what Flax passes outside training). The
    # checks run in Python, so tracing (no compilation) is enough to pass them.
    for rate, deterministic in ((0.1, True), (0.0, False)):
        out = jax.eval_shape(lambda x, r=rate, d=deterministic: fn(
            x, x, x, dropout_rate=r, deterministic=d, **kw), X)
        assert out.shape == X.shape
