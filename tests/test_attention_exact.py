"""Each method against its exact O(n²) target, at the limits where it must be exact, in float64.

Methods are called through ``jitted``: one compiled program per method, static keywords and
shape, reused by every seed and test at that shape (compiling dominates the tests' time).
"""

from __future__ import annotations

import functools

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


# ---------------------------------------------------------------- exact softmax


def test_softmax_hand_computed_value():
    # weights softmax([ln 3, 0]) = [3/4, 1/4] on values [4, 0] -> 3.
    q = jnp.array([[[[np.log(3.0)]]]])
    k = jnp.array([[[[1.0]], [[0.0]]]])
    v = jnp.array([[[[4.0]], [[0.0]]]])
    out = sa.softmax_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), scale=1.0
    )
    np.testing.assert_allclose(float(out[0, 0, 0, 0]), 3.0, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_matches_numpy_with_mask_and_bias(causal):
    q, k, v = (x.astype(jnp.float32) for x in qkv64(1, (1, 40, 1, 8)))
    valid = jnp.arange(40) < 33
    mask = valid[None, None, None, :]
    bias = 0.1 * jax.random.normal(jax.random.key(2), (1, 1, 40, 40))
    out = jitted(sa.softmax_attention, is_causal=causal)(q, k, v, bias=bias, mask=mask)
    logits = (one_head(q) @ one_head(k).T) / np.sqrt(8) + np.asarray(bias)[0, 0]
    allowed = np.broadcast_to(np.asarray(valid), (40, 40))
    if causal:
        allowed = allowed & np.tril(np.ones((40, 40), bool))
    expected = ref.softmax(logits, allowed) @ one_head(v)
    np.testing.assert_allclose(one_head(out), expected, atol=2e-5)
    np.testing.assert_allclose(
        one_head(jitted(sa.reference_attention, is_causal=causal)(q, k, v, bias=bias, mask=mask)),
        expected,
        atol=2e-5,
    )


# ---------------------------------------------------------------- pseudo-inverse


def test_pinv_matches_float64_iteration_and_converges_on_well_conditioned():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(12, 12))
    spd = a @ a.T / 12 + np.eye(12)
    for iters in (1, 3, 6):
        np.testing.assert_allclose(
            np.asarray(sa.iterative_pinv(jnp.asarray(spd), iters)),
            ref.pinv_iteration(spd, iters),
            rtol=1e-10,
            atol=1e-12,
        )
    errors = [
        np.linalg.norm(np.asarray(sa.iterative_pinv(jnp.asarray(spd), t)) @ spd - np.eye(12))
        for t in (2, 4, 6, 8)
    ]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-8


def test_pinv_on_landmark_softmax_kernel_and_preconditioned_gaussian():
    q, k, _ = qkv64(3, (1, 256, 1, 16))
    _, a, _ = ref.nystrom_kernels(one_head(q), one_head(k), 1 / 4, 16, np.ones(256, bool))
    resid = [
        np.linalg.norm(a @ np.asarray(sa.iterative_pinv(jnp.asarray(a), t)) @ a - a)
        / np.linalg.norm(a)
        for t in (1, 3, 6, 12)
    ]
    assert resid == sorted(resid, reverse=True) and resid[2] < 0.1
    # Skyformer's D^{-1/2}(M + γI)D^{-1/2} has spectrum in (0, 1]: the iteration converges.
    x = one_head(q)[::8] / 16**0.25
    m = ref.gaussian_kernel(x, x) + 0.1 * np.eye(len(x))
    dm = m / np.sqrt(np.outer(m.sum(1), m.sum(1)))
    assert np.linalg.eigvalsh(dm).max() <= 1 + 1e-12
    z = np.asarray(sa.iterative_pinv(jnp.asarray(dm), 20))
    np.testing.assert_allclose(z @ dm, np.eye(len(x)), atol=1e-6)


# ---------------------------------------------------------------- Nyström


@pytest.mark.parametrize("fn", [sa.nystrom_attention, sa.spectral_shift_attention])
def test_landmarks_at_least_length_is_exact_softmax(fn):
    q, k, v = qkv64(4, (2, 50, 2, 8))
    chex.assert_trees_all_close(
        jitted(fn, num_landmarks=64)(q, k, v), jitted(sa.reference_attention)(q, k, v), atol=1e-12
    )


def test_one_landmark_per_token_with_exact_pinv_reproduces_s():
    # 12 valid tokens, 16 landmarks < 32 = n: the landmark formula runs and each valid token is
    # its own landmark, so F = A = B = S and S S⁺ S = S.
    q, k, v = qkv64(5, (1, 32, 1, 8))
    valid = jnp.arange(32) < 12
    mask = valid[None, None, :, None] & valid[None, None, None, :]
    out = jitted(sa.nystrom_attention, num_landmarks=16, pinv_iterations=None)(q, k, v, mask=mask)
    expected = jitted(sa.reference_attention)(q, k, v, mask=mask)
    chex.assert_trees_all_close(out, expected, atol=1e-9)


@pytest.mark.parametrize("n,m", [(70, 16), (100, 24)])
def test_nystrom_matches_numpy_formula_when_length_not_divisible(n, m):
    q, k, v = qkv64(6, (1, n, 1, 8))
    valid = np.arange(n) < n - 7
    mask = jnp.asarray(valid)[None, None, :, None] & jnp.asarray(valid)[None, None, None, :]
    out = jitted(sa.nystrom_attention, num_landmarks=m)(q, k, v, mask=mask)
    f, a, b = ref.nystrom_kernels(one_head(q), one_head(k), 1 / np.sqrt(8), m, valid)
    expected = f @ ref.pinv_iteration(a, 6) @ (b @ one_head(v))
    expected[~valid] = 0.0
    np.testing.assert_allclose(one_head(out), expected, atol=1e-10)
    exact = jitted(sa.reference_attention)(q, k, v, mask=mask)
    assert rel_err(one_head(out)[valid], one_head(exact)[valid]) < 0.1


# ---------------------------------------------------------------- spectral shifting


def _sharp(seed, n=256, d=16, norm=3.0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = norm * jax.random.normal(k1, (1, n, 1, d), jnp.float64)
    return x, x, jax.random.normal(k2, (1, n, 1, d), jnp.float64)


def test_spectral_shift_with_zero_shift_is_nystrom_bitwise():
    q, k, v = (x.astype(jnp.float32) for x in qkv64(7, (2, 96, 2, 8)))
    np.testing.assert_array_equal(
        np.asarray(jitted(sa.spectral_shift_attention, num_landmarks=16, shift="zero")(q, k, v)),
        np.asarray(jitted(sa.nystrom_attention, num_landmarks=16)(q, k, v)),
    )


def test_spectral_shift_matches_numpy_closed_form():
    q, k, v = _sharp(8, n=96, d=8, norm=2.0)
    m = 12
    closed = dict(num_landmarks=m, pinv_iterations=None, shift="exact")
    out = jitted(sa.spectral_shift_attention, **closed)(q, k, v)
    valid = np.ones(96, bool)
    qn, kn, vn = one_head(q), one_head(k), one_head(v)
    f, a, b = ref.nystrom_kernels(qn, kn, 1 / np.sqrt(8), m, valid)
    s = ref.softmax(qn @ kn.T / np.sqrt(8))
    nys = f @ np.linalg.pinv(a) @ b
    delta = (np.trace(s) - np.trace(nys)) / (96 - np.trace(nys))
    assert 0.3 < delta < 1.0  # sharp attention: the residual's diagonal is large, no clipping
    approx = (1 - delta) * nys + delta * np.eye(96)
    np.testing.assert_allclose(one_head(out), approx @ vn, atol=1e-8)
    # The defining properties: the shifted matrix has S's trace, and rows that sum to one.
    np.testing.assert_allclose(np.trace(approx), np.trace(s), rtol=1e-10)
    np.testing.assert_allclose(approx.sum(-1), 1.0, atol=1e-8)
    np.testing.assert_allclose(
        float(jitted(sa.spectral_shift_delta, **closed)(q, k)[0, 0]), delta, rtol=1e-10
    )


def _shift_reference(q, k, v, m, shift="paired", rows=32, iterations=6):
    """The defining formula, dense and unfused, one head, no padding, in q's dtype (autodiff).

    δ from ``rows`` diagonal rows spread evenly over the n tokens: ``"paired"`` takes both
    traces from them, ``"split"`` only tr S (tr(F Z B) over every row).
    """
    n, d = q.shape
    q = q / np.sqrt(d)
    q_lm, k_lm = q.reshape(m, n // m, d).mean(1), k.reshape(m, n // m, d).mean(1)
    f, a, b = (jax.nn.softmax(x @ y.T, axis=-1) for x, y in ((q, k_lm), (q_lm, k_lm), (q_lm, k)))
    z = a.T / (jnp.abs(a).sum(0).max() * jnp.abs(a).sum(1).max())
    eye = jnp.eye(m, dtype=a.dtype)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    sample = (np.arange(rows) * 2 + 1) * n // (2 * rows)
    s_diag = jax.nn.softmax(q[sample] @ k.T, axis=-1)[np.arange(rows), sample]
    nystrom = f @ z @ b
    if shift == "paired":
        n_diag = nystrom[sample, sample]
        delta = jnp.sum(s_diag - n_diag) / jnp.sum(1 - n_diag)
    else:
        trace_nystrom = jnp.trace(nystrom)
        delta = (n * jnp.mean(s_diag) - trace_nystrom) / (n - trace_nystrom)
    delta = jnp.clip(delta, 0.0, 1.0)
    return (1 - delta) * nystrom @ v + delta * v, delta


# The paired form's default sample (max(32, m // 2) rows), and the split form's (m rows).
@pytest.mark.parametrize("shift, rows", [("paired", 32), ("split", 8)])
def test_spectral_shift_outputs_and_gradients_match_float64_formula(shift, rows):
    # δ strictly inside (0, 1), so the gradient through both traces counts.
    q, k, v = _sharp(11, n=64, d=8, norm=1.0)
    q = q + 0.5 * jax.random.normal(jax.random.key(13), q.shape, jnp.float64)
    g = jax.random.normal(jax.random.key(12), v.shape, jnp.float64)

    @jax.jit
    def reference(q, k, v):  # (output, δ) and the gradients of sum(g * output)
        (out, delta), pullback = jax.vjp(
            lambda q, k, v: _shift_reference(q, k, v, 8, shift, rows), q, k, v
        )
        return out, delta, pullback((one_head(g), jnp.zeros_like(delta)))

    @jax.jit
    def method(q, k, v):  # the output and the gradients of sum(g * output), in float32
        out, pullback = jax.vjp(
            lambda q, k, v: sa.spectral_shift_attention(q, k, v, num_landmarks=8, shift=shift),
            q, k, v,
        )
        return out, pullback(g.astype(jnp.float32))

    ref_out, delta, ref_grads = reference(one_head(q), one_head(k), one_head(v))
    assert 0.05 < float(delta) < 0.95
    out, grads = method(*(x.astype(jnp.float32) for x in (q, k, v)))
    for got, want in zip((out, *grads), (ref_out, *ref_grads)):
        np.testing.assert_allclose(one_head(got), want, rtol=0,
                                   atol=2e-5 * float(jnp.abs(want).max()))


def test_spectral_shift_on_identity_attention_is_exact():
    # q = k with huge norms: S = I to float64 precision, tr S = n, δ = 1, and the output is V
    # whatever the landmarks; the pre-(1 − δ) form F(Z − δF⁺B⁺)B + δI missed this by 3-12%.
    q, k, v = _sharp(2, n=128, d=64, norm=3.0)
    exact = jitted(sa.reference_attention)(q, k, v)
    np.testing.assert_allclose(one_head(exact), one_head(v), atol=1e-12)
    for m in (8, 32):
        out = jitted(sa.spectral_shift_attention, num_landmarks=m, shift="exact")(q, k, v)
        assert rel_err(out, exact) < 1e-9, m


@pytest.mark.parametrize("seed", [0, 1])
def test_spectral_shift_beats_nystrom_on_sharp_and_ties_on_diffuse(seed):
    q, k, v = _sharp(seed)
    exact = jitted(sa.reference_attention)(q, k, v)
    for m in (16, 32):
        nys = rel_err(jitted(sa.nystrom_attention, num_landmarks=m)(q, k, v), exact)
        ss = rel_err(jitted(sa.spectral_shift_attention, num_landmarks=m)(q, k, v), exact)
        assert nys > 0.9 and ss < 0.6 * nys, (m, nys, ss)
    q, k, v = qkv64(10 + seed, (1, 256, 1, 16))
    exact = jitted(sa.reference_attention)(q, k, v)
    for m in (8, 16, 32):
        nys = rel_err(jitted(sa.nystrom_attention, num_landmarks=m)(q, k, v), exact)
        ss = rel_err(jitted(sa.spectral_shift_attention, num_landmarks=m)(q, k, v), exact)
        assert ss <= 1.01 * nys, (m, nys, ss)


@pytest.mark.slow  # two regimes at n = 256; the float64 formula tests cover δ in CI
def test_delta_nonnegative_and_estimate_tracks_exact_trace():
    for regime, (q, k, v) in {"sharp": _sharp(3), "diffuse": qkv64(4, (1, 256, 1, 16))}.items():
        est = float(jitted(sa.spectral_shift_delta, num_landmarks=16)(q, k)[0, 0])
        exact = float(jitted(sa.spectral_shift_delta, num_landmarks=16, shift="exact")(q, k)[0, 0])
        assert 0 <= est <= 1 and 0 <= exact <= 1
        # 32 sampled rows of 256 (the paired default at m = 16): δ within 15%, and the
        # output within 8% of its error with the exact δ (the whole low-rank part is
        # weighted by 1 − δ).
        assert abs(est - exact) <= 0.15 * max(exact, 0.02), (regime, est, exact)
        target = jitted(sa.reference_attention)(q, k, v)
        err_est = rel_err(jitted(sa.spectral_shift_attention, num_landmarks=16)(q, k, v), target)
        err_exact = rel_err(
            jitted(sa.spectral_shift_attention, num_landmarks=16, shift="exact")(q, k, v), target
        )
        assert err_est <= 1.08 * err_exact, (regime, err_est, err_exact)
    # Pure noise tokens with large norms: the tokens are nearly orthogonal, S ≈ I, δ ≈ 1.
    q, k, _ = _sharp(5, norm=4.0)
    assert float(
        jitted(sa.spectral_shift_delta, num_landmarks=16, shift="exact")(q, k)[0, 0]
    ) == pytest.approx(1.0, abs=0.1)
    # Random inputs in float32 never give a shift outside [0, 1].
    for seed in range(3):
        x = jax.random.normal(jax.random.key(seed), (2, 64, 2, 8), jnp.float32) * (seed + 0.5)
        delta = jitted(sa.spectral_shift_delta, num_landmarks=8)(x, x[::-1])
        assert float(delta.min()) >= 0.0 and float(delta.max()) <= 1.0


# ------------------------------------------------------------ symmetric (SPSD) spectral shifting


@pytest.mark.parametrize("kernel", ["softmax", "gaussian"])
def test_symmetric_shift_exact_with_one_landmark_per_token(kernel):
    x, _, v = qkv64(12, (1, 40, 1, 8))
    valid = jnp.arange(40) < 20
    mask = valid[None, None, :, None] & valid[None, None, None, :]
    # key is query: one traced array passed as both.
    out = jax.jit(
        lambda x, v, mask: sa.symmetric_spectral_shift_attention(
            x, x, v, mask=mask, kernel=kernel, num_landmarks=24
        )
    )(x, v, mask)
    exact = sa.reference_attention if kernel == "softmax" else sa.kernelized_attention
    target = jitted(exact)(x, x, v, mask=mask)
    chex.assert_trees_all_close(out, target, atol=1e-8)


def test_symmetric_shift_frobenius_error_not_above_nystrom():
    # Gaussian kernel with a flat spectral tail (well-separated points): the shift recovers it.
    x = 2.0 * jax.random.normal(jax.random.key(13), (1, 128, 1, 8), jnp.float64)
    eye = jnp.eye(128, dtype=jnp.float64)[None, :, None, :]
    exact = jitted(sa.kernelized_attention)(x, x, eye)
    symmetric = functools.partial(
        jitted, sa.symmetric_spectral_shift_attention, kernel="gaussian", num_landmarks=16
    )
    nys = rel_err(symmetric(shift="none")(x, None, eye), exact)
    ss = rel_err(symmetric()(x, None, eye), exact)
    assert ss < 0.5 * nys, (nys, ss)
    with pytest.raises(ValueError, match="key == query"):
        sa.symmetric_spectral_shift_attention(x, x + 1.0, eye)


# ---------------------------------------------------------------- Skyformer / kernelized


def test_kernelized_matches_gaussian_kernel_formula():
    q, k, v = qkv64(14, (1, 30, 1, 8))
    c = 8**-0.25
    expected = ref.gaussian_kernel(one_head(q) * c, one_head(k) * c) @ one_head(v)
    got = one_head(jitted(sa.kernelized_attention)(q, k, v))
    np.testing.assert_allclose(got, expected, atol=1e-10)


def test_skyformer_with_every_position_is_kernelized_attention():
    q, k, v = qkv64(15, (2, 48, 2, 8))
    valid = jnp.arange(48)[None, :] < jnp.array([[40], [48]])
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    # Example 0 has 40 valid tokens: 80 landmarks are every valid query and key once.
    out = jitted(sa.skyformer_attention, num_landmarks=80, ridge=0.0, pinv_iterations=None)(
        q[:1], k[:1], v[:1], mask=mask[:1]
    )
    chex.assert_trees_all_close(
        out, jitted(sa.kernelized_attention)(q[:1], k[:1], v[:1], mask=mask[:1]), atol=1e-8
    )


@pytest.mark.slow  # five landmark counts at n = 256; exactness at every position is in CI
def test_skyformer_error_falls_with_landmarks():
    q, k, v = (x.astype(jnp.float32) for x in qkv64(16, (1, 256, 2, 16)))
    exact = jitted(sa.kernelized_attention)(q, k, v)
    errs = [
        rel_err(jitted(sa.skyformer_attention, num_landmarks=m)(q, k, v), exact)
        for m in (16, 32, 64, 128, 256)
    ]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.15, errs
    sampled = [
        np.mean(
            [
                rel_err(
                    jitted(sa.skyformer_attention, num_landmarks=m)(q, k, v, rng=jax.random.key(s)),
                    exact,
                )
                for s in range(3)
            ]
        )
        for m in (32, 128)
    ]
    assert sampled[1] < 0.7 * sampled[0], sampled


@pytest.mark.parametrize("fn", [sa.nystrom_attention, sa.spectral_shift_attention])
def test_few_valid_keys_are_exact_whatever_the_padding(fn):
    # 40 valid tokens and 64 landmarks: unpadded, the shortcut gives exact softmax; padded to
    # 128 in a batch with a full example, the landmark path must give the same answer.
    q, k, v = qkv64(22, (2, 128, 2, 8))
    lengths = jnp.array([40, 128])
    fn = jitted(fn, num_landmarks=64)
    padded = fn(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    alone = fn(q[:1, :40], k[:1, :40], v[:1, :40])
    chex.assert_trees_all_close(padded[0, :40], alone[0], atol=1e-9)
    chex.assert_trees_all_close(
        alone, jitted(sa.reference_attention)(q[:1, :40], k[:1, :40], v[:1, :40]), atol=1e-12
    )
