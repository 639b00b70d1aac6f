"""bench error: metrics, implicit matrices and the accuracy orderings it reports (fixed seeds)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.attention import kernelized_attention, skyformer_attention
from spectral_jax.lra.bench import error, inputs, methods

N, D, HEADS = 128, 16, 1
BUDGETS = (8, 32, 64)


def _by_key(rows):
    return {(r["regime"], r["method"], r["budget"]): r["output_mean"] for r in rows}


@pytest.fixture(scope="module")
def landmark_rows():
    records = error.run_error(
        methods=["nystrom", "spectral_shift", "skyformer", "linformer"], budgets=BUDGETS,
        regimes=["diffuse", "sharp", "random_walk"], seeds=[0, 1], length=N, heads=HEADS,
        head_dim=D, matrix_max_length=0,
    )
    return _by_key(error.summarize(records))


def test_relative_errors_hand_computed():
    assert error.relative_output_error([3.0, 4.0], [0.0, 5.0]) == pytest.approx(
        np.sqrt(9 + 1) / 5
    )
    s = np.diag([2.0, 1.0])[None]
    fro, spec = error.relative_matrix_errors(s + np.diag([0.0, 1.0])[None], s)
    assert fro == pytest.approx(1 / np.sqrt(5))
    assert spec == pytest.approx(0.5)
    with pytest.raises(ValueError, match="all zeros"):
        error.relative_output_error([1.0], [0.0])
    with pytest.raises(ValueError, match="shape"):
        error.relative_matrix_errors(np.eye(2), np.eye(3))


def test_implicit_matrix_is_the_attention_matrix():
    q, k, v = inputs.make_inputs("diffuse", jax.random.key(0), length=40, heads=2, head_dim=8)
    logits = np.einsum("bqhd,bkhd->bhqk", np.float64(q), np.float64(k)) / np.sqrt(8)
    exact = np.exp(logits - logits.max(-1, keepdims=True))
    exact /= exact.sum(-1, keepdims=True)
    matrix = jax.jit(error.implicit_matrix, static_argnums=0)
    chex.assert_trees_all_close(
        matrix(methods.bind("softmax"), q, k, {}), exact.astype(np.float32), atol=1e-5
    )
    # Linearity in V: S V reproduces the method's own output (40 = 5 chunks of head_dim 8).
    nys = methods.bind("nystrom", 8)
    s = matrix(nys, q, k, {})
    chex.assert_shape(s, (1, 2, 40, 40))
    chex.assert_trees_all_close(
        jnp.einsum("bhqk,bkhd->bqhd", s, v), nys(q, k, v, {}), atol=1e-4, rtol=1e-4
    )


def test_every_budgeted_method_error_falls(landmark_rows):
    for regime in ("diffuse", "sharp", "random_walk"):
        for method in ("nystrom", "spectral_shift", "skyformer", "linformer"):
            errs = [landmark_rows[(regime, method, b)] for b in BUDGETS]
            assert all(a > b for a, b in zip(errs, errs[1:])), (regime, method, errs)


def test_performer_error_falls_with_features():
    rows = error.summarize(error.run_error(
        methods=["performer"], budgets=[16, 4096], regimes=["random_walk"], seeds=[0, 1],
        length=N, heads=HEADS, head_dim=D, matrix_max_length=0,
    ))
    errs = [r["output_mean"] for r in rows]
    assert errs[1] < 0.7 * errs[0], errs


def test_spectral_shift_beats_nystrom_on_sharp_and_matches_on_diffuse(landmark_rows):
    for b in BUDGETS:
        ss = landmark_rows[("sharp", "spectral_shift", b)]
        nys = landmark_rows[("sharp", "nystrom", b)]
        assert ss < 0.85 * nys, (b, ss, nys)
        ss = landmark_rows[("diffuse", "spectral_shift", b)]
        nys = landmark_rows[("diffuse", "nystrom", b)]
        assert ss <= 1.01 * nys, (b, ss, nys)
    # At the smallest budget the shift restores almost all of the identity Nyström cannot.
    assert landmark_rows[("sharp", "spectral_shift", 8)] < 0.5


def test_skyformer_converges_to_kernelized_attention():
    q, k, v = inputs.make_inputs("random_walk", jax.random.key(3), length=32, heads=2,
                                 head_dim=8)
    exact = jax.jit(kernelized_attention)(q, k, v)
    sky = jax.jit(skyformer_attention, static_argnames=("num_landmarks", "ridge",
                                                        "pinv_iterations"))
    # Every query and key as a landmark, no ridge, exact pinv: Skyformer is the kernel itself.
    full = sky(q, k, v, num_landmarks=64, ridge=0.0, pinv_iterations=None)
    chex.assert_trees_all_close(full, exact, atol=2e-3, rtol=2e-3)
    errs = [error.relative_output_error(sky(q, k, v, num_landmarks=m), exact)
            for m in (4, 16, 64)]
    assert errs[0] > errs[1] > errs[2], errs


def test_matrix_metrics_and_summary_shape():
    records = error.run_error(methods=["nystrom", "linear"], budgets=[4, 16],
                              regimes=["random_walk"], seeds=[0, 1], length=32, heads=1,
                              head_dim=8)
    # linear has no budget: one record per seed; nystrom: one per budget and seed.
    assert [(r["method"], r["budget"]) for r in records[:3]] == [
        ("nystrom", 4), ("nystrom", 16), ("linear", None)]
    rows = error.summarize(records)
    assert len(rows) == 3 and all(r["seeds"] == 2 for r in rows)
    for r in rows:
        assert 0 < r["frobenius_mean"] < 2 and 0 < r["spectral_mean"] < 2
        assert r["output_std"] >= 0
    nys = {r["budget"]: r for r in rows if r["method"] == "nystrom"}
    assert nys[16]["frobenius_mean"] < nys[4]["frobenius_mean"]


def test_qkv_inputs_with_padding_mask():
    q, k, v = inputs.make_inputs("random_walk", jax.random.key(1), batch=2, length=32,
                                 heads=1, head_dim=8)
    mask = np.ones((2, 32), bool)
    mask[1, 20:] = False
    qkv = error.QKV(np.asarray(q), np.asarray(k), np.asarray(v), mask, name="checkpoint")
    records = error.run_error(methods=["nystrom"], budgets=[32], seeds=[0], qkv=qkv)
    # 32 landmarks >= 32 tokens: Nyström falls back to exact softmax, error ~ 0.
    assert records[0]["regime"] == "checkpoint" and records[0]["length"] == 32
    assert records[0]["output"] < 1e-5 and records[0]["frobenius"] < 1e-5


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="regimes"):
        error.run_error(methods=["nystrom"], regimes=["spiky"], budgets=[4], length=16)
    with pytest.raises(ValueError, match="budgets"):
        error.run_error(methods=["nystrom"], budgets=[0], length=16)
    with pytest.raises(ValueError, match="Unknown attention"):
        error.run_error(methods=["nystromformer"], budgets=[4], length=16)
    with pytest.raises(ValueError, match="regime"):
        inputs.make_inputs("spiky", jax.random.key(0))
    with pytest.raises(ValueError, match="budget"):
        methods.make_state("performer", jax.random.key(0), budget=None, length=8, head_dim=4)


def test_regimes_have_the_advertised_sharpness():
    def trace_s(regime):
        q, k, _ = inputs.make_inputs(regime, jax.random.key(0), length=256, heads=1,
                                     head_dim=32)
        s = jax.jit(error.implicit_matrix, static_argnums=0)(methods.bind("softmax"), q, k, {})
        return float(jnp.trace(s[0, 0]))

    assert trace_s("diffuse") < 5  # ≈ 1: attention spread over many keys
    assert trace_s("sharp") > 0.95 * 256  # ≈ n: near-identity
    walk = inputs.random_walk_tokens(jax.random.key(0), (1, 4096, 1, 1), 16.0)[0, :, 0, 0]
    lag1 = float(jnp.corrcoef(walk[:-1], walk[1:])[0, 1])
    assert lag1 == pytest.approx(np.exp(-1 / 16), abs=0.03)
    assert float(jnp.var(walk)) == pytest.approx(1.0, abs=0.2)


@pytest.mark.parametrize("regime", inputs.REGIMES)
def test_inputs_keep_their_dtype_with_x64_enabled(regime):
    # x64 must not change the benchmark's inputs: the random walk's scan and its projections
    # stay in the requested dtype.
    base = inputs.make_inputs(regime, jax.random.key(0), length=16, heads=1, head_dim=4)
    with jax.enable_x64(True):
        for dtype in (jnp.float32, jnp.float64):
            q, k, v = inputs.make_inputs(regime, jax.random.key(0), length=16, heads=1,
                                         head_dim=4, dtype=dtype)
            assert q.dtype == k.dtype == v.dtype == dtype
            if dtype == jnp.float32:
                for got, want in zip((q, k, v), base):
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
