"""Spectral shifting's δ: the paired estimate from sampled diagonal rows, and its other forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import jitted
from jax.test_util import check_grads

from spectral_jax import attention as sa

FORMS = ("paired", "split", "exact")


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def _circle(count, radius, turns=1):
    angle = 2 * np.pi * turns * np.arange(count) / count
    return radius * np.stack([np.cos(angle), np.sin(angle)], -1)


def _symmetric_tokens(num_segments=8, per_segment=6, outer=1.5, inner=1.2):
    """Tokens x_(a,t) = (u_a, w_t), u on one circle, w on another, segment a holding t = 0..r-1.

    Shifting a (with the landmarks) or t (inside every segment) maps the set onto itself and
    keeps each segment whole, and every token is reached from every other: S's diagonal and
    the Nyström diagonal F_i Z B_{:,i} are then both constant. Segment means kill w, so the
    landmarks miss part of S and the residual's trace is not zero.
    """
    u, w = _circle(num_segments, outer), _circle(per_segment, inner)
    x = np.concatenate([np.repeat(u, per_segment, 0), np.tile(w, (num_segments, 1))], -1)
    return jnp.asarray(x[None, :, None, :])


def _delta(q, k, **kw):
    arrays = {name: x for name, x in kw.items() if isinstance(x, jax.Array)}
    static = {name: x for name, x in kw.items() if name not in arrays}
    fn = jitted(sa.spectral_shift_delta, scale=1.0, num_landmarks=8, **static)
    return float(fn(q, k, **arrays)[0, 0])


def test_sampled_forms_equal_exact_delta_when_both_diagonals_are_constant():
    x = _symmetric_tokens()
    exact = _delta(x, x, shift="exact")
    assert 0.05 < exact < 0.95  # no clipping, so the equality is a real check
    # Five rows of 48 evenly spaced: not one per segment, nor at one offset inside them.
    for shift in ("paired", "split"):
        assert _delta(x, x, shift=shift, num_delta_rows=5) == pytest.approx(exact, rel=1e-12)


def test_paired_delta_is_exact_when_every_valid_row_is_sampled():
    x = 2.0 * jax.random.normal(jax.random.key(0), (1, 48, 1, 8), jnp.float64)
    y = x + jax.random.normal(jax.random.key(1), x.shape, jnp.float64)
    lengths = jnp.array([30])
    exact = _delta(x, y, shift="exact", query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    assert 0.05 < exact < 0.95
    # 32 rows for 30 valid tokens (each taken once), and 64 rows for all 48 positions.
    assert _delta(x, y, num_delta_rows=32, query_seq_lengths=lengths,
                  key_value_seq_lengths=lengths) == pytest.approx(exact, rel=1e-12)
    assert _delta(x, y, num_delta_rows=64) == pytest.approx(_delta(x, y, shift="exact"), rel=1e-12)
    # With fewer rows it is an estimate, not the exact value.
    est = _delta(x, y, num_delta_rows=8, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    assert abs(est - exact) > 1e-3


# Finite differences in float64 (~70 s of compiling); the delta's gradient flow is also
# checked by the float32 padding test below.
@pytest.mark.slow
def test_paired_delta_gradient_matches_finite_differences():
    key = jax.random.key(3)
    x = jax.random.normal(key, (1, 40, 1, 4), jnp.float64)
    q = 1.5 * x + 0.3 * jax.random.normal(jax.random.fold_in(key, 1), x.shape, jnp.float64)
    v = jax.random.normal(jax.random.fold_in(key, 2), x.shape, jnp.float64)
    kw = dict(scale=1.0, num_landmarks=4, num_delta_rows=6, shift="paired")
    delta = float(sa.spectral_shift_delta(q, x, **kw)[0, 0])
    assert 0.05 < delta < 0.95  # inside the clip: the gradient flows through δ
    check_grads(jax.jit(lambda q, k: sa.spectral_shift_delta(q, k, **kw)), (q, x), order=1,
                modes=["rev"], atol=1e-6, rtol=1e-6)
    check_grads(jax.jit(lambda q, k, v: sa.spectral_shift_attention(q, k, v, **kw)), (q, x, v),
                order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("shift", FORMS)
def test_delta_and_output_ignore_padding_and_batch_mates(shift):
    key = jax.random.key(5)
    x = 1.5 * jax.random.normal(key, (1, 37, 2, 8), jnp.float32)
    v = jax.random.normal(jax.random.fold_in(key, 1), x.shape, jnp.float32)
    kw = dict(num_landmarks=8, num_delta_rows=6, shift=shift)
    delta_fn = jax.jit(lambda x, mask=None: sa.spectral_shift_delta(x, x, mask, **kw))
    attention = jax.jit(lambda x, v, mask=None: sa.spectral_shift_attention(
        x, x, v, mask=mask, **kw))
    alone_delta, alone_out = delta_fn(x), attention(x, v)
    assert float(alone_delta.min()) > 0.05
    # The same 37 tokens with 11 padding tokens in front and 16 behind, next to a batch-mate
    # of 64 other tokens, and a fully padded third example.
    pad = lambda a, fill: jnp.concatenate(  # noqa: E731
        [jnp.full((1, 11, 2, 8), fill), a, jnp.full((1, 16, 2, 8), fill)], 1)
    other = jax.random.normal(jax.random.fold_in(key, 2), (1, 64, 2, 8), jnp.float32)
    xs = jnp.concatenate([pad(x, 50.0), other, other], 0).astype(jnp.float32)
    vs = jnp.concatenate([pad(v, 50.0), other, other], 0).astype(jnp.float32)
    valid = jnp.stack([(jnp.arange(64) >= 11) & (jnp.arange(64) < 48), jnp.ones(64, bool),
                       jnp.zeros(64, bool)])
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    delta, out = delta_fn(xs, mask), attention(xs, vs, mask)
    np.testing.assert_allclose(delta[0], alone_delta[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0, 11:48], alone_out[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(delta[2], 0.0)
    np.testing.assert_array_equal(out[2], 0.0)
    np.testing.assert_array_equal(out[0, :11], 0.0)
    grads = jax.jit(jax.grad(lambda a, b: jnp.sum(attention(a, b, mask) ** 2),
                             argnums=(0, 1)))(xs, vs)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    np.testing.assert_array_equal(grads[1][2], 0.0)


def test_sampled_rows_and_forms_are_checked():
    x = jnp.ones((1, 16, 1, 4), jnp.float32)
    with pytest.raises(ValueError, match=r"num_delta_rows.*positive.*got 0"):
        sa.spectral_shift_attention(x, x, x, num_landmarks=4, num_delta_rows=0)
    with pytest.raises(TypeError, match=r"num_delta_rows"):
        sa.spectral_shift_delta(x, x, num_landmarks=4, num_delta_rows="8")
    with pytest.raises(ValueError, match=r"shift.*'paired'.*'split'.*'exact'.*'zero'"):
        sa.spectral_shift_attention(x, x, x, num_landmarks=4, shift="estimate")
