"""The linear-recurrent family's chunked form against the token-by-token float64 recurrence.

Every method, several chunk sizes (the length never a multiple), padding, packed segments,
grouped query and value heads; gradients against the library's scan reference; extreme gates;
bf16; the argument errors.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from recurrent_cases import DELTA, FUNCTIONS, inputs, numpy_recurrence

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import recurrent as rec
from spectral_jax.attention.recurrent import _chunk

METHODS = tuple(FUNCTIONS)


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


def _call(method, q, k, v, kw, **extra):
    fn = functools.partial(FUNCTIONS[method], **extra)
    arrays = {n: x for n, x in kw.items() if isinstance(x, np.ndarray)}
    static = {n: x for n, x in kw.items() if n not in arrays}
    return jax.jit(lambda q, k, v, a: fn(q, k, v, **a, **static))(q, k, v, arrays)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("method", METHODS)
def test_chunked_equals_recurrence_float64(method, float64):
    q, k, v, kw = inputs(method, heads=(2, 2, 2))
    expected = numpy_recurrence(method, q, k, v, kw)
    for chunk_size in (1, 8, 16, 64):
        out = _call(method, q, k, v, kw, chunk_size=chunk_size)
        assert _rel(out, expected) < 1e-10, chunk_size


@pytest.mark.parametrize("associative", [False, True])
@pytest.mark.parametrize("method", ["gla", "retnet", "mamba2"])
def test_both_additive_state_passes_equal_recurrence_float64(method, associative, float64,
                                                              monkeypatch):
    # CPU runs the sequential pass over chunks; accelerators the associative scan. Both are
    # checked here, outputs and gradients, on packed segments and a padded tail.
    monkeypatch.setattr(_chunk, "associative_states", lambda: associative)
    q, k, v, kw = inputs(method, 1, n=29)
    ids = np.repeat(np.array([[0, 1, 2], [3, 3, 4]]), [9, 11, 9], axis=1)
    expected = numpy_recurrence(method, q, k, v, kw, segment_ids=ids)
    out = _call(method, q, k, v, kw, chunk_size=8, segment_ids=jnp.asarray(ids, jnp.int32))
    assert _rel(out, expected) < 1e-10

    def loss(q, k, v, flag):
        monkeypatch.setattr(_chunk, "associative_states", lambda: flag)
        fn = functools.partial(FUNCTIONS[method], chunk_size=8,
                               segment_ids=jnp.asarray(ids, jnp.int32), **kw)
        return jnp.sum(jnp.sin(fn(q, k, v)))

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, associative)
    other = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, not associative)
    for a, b in zip(grads, other, strict=True):
        assert _rel(a, b) < 1e-10


@pytest.mark.parametrize("method", METHODS)
def test_padding_and_segments_float64(method, float64):
    q, k, v, kw = inputs(method, 1, n=29)
    valid = np.ones((2, 29), bool)
    valid[0, 22:] = False          # right padding
    valid[1, 5:7] = False          # holes (a padding mask need not be a prefix)
    ids = np.repeat(np.array([[0, 1, 2], [3, 3, 4]]), [9, 11, 9], axis=1)
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    expected = numpy_recurrence(method, q, k, v, kw, valid=valid, segment_ids=ids)
    out = _call(method, q, k, v, kw, chunk_size=8, mask=jnp.asarray(mask),
                segment_ids=jnp.asarray(ids, jnp.int32))
    assert _rel(out, expected) < 1e-10
    # Padded content never reaches a valid output.
    q2, k2, v2 = (np.where(valid[:, :, None, None], x, 1e3) for x in (q, k, v))
    out2 = _call(method, q2, k2, v2, kw, chunk_size=8, mask=jnp.asarray(mask),
                 segment_ids=jnp.asarray(ids, jnp.int32))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


@pytest.mark.parametrize("method", ["gla", "mamba2", "deltanet", "gated_deltanet"])
@pytest.mark.parametrize("heads", [(4, 2, 2), (4, 1, 1), (2, 2, 4), (1, 1, 4)])
def test_grouped_heads_float64(method, heads, float64):
    if heads[0] != heads[1] and heads[2] > heads[0]:
        pytest.skip("grouped values need as many query heads as key heads")
    q, k, v, kw = inputs(method, 2, n=21, heads=heads)
    expected = numpy_recurrence(method, q, k, v, kw)
    out = _call(method, q, k, v, kw, chunk_size=8)
    assert out.shape == expected.shape
    assert _rel(out, expected) < 1e-10
    if heads[0] > heads[2]:
        # Grouped queries equal the same call with keys and values repeated per query head.
        r = heads[0] // heads[2]
        rep = {n: (np.repeat(x, r, axis=2) if n in ("g", "beta", "dt") else
                   np.repeat(x, r, axis=0) if n in ("A", "D", "dt_bias") else x)
               for n, x in kw.items()}
        full = _call(method, q, np.repeat(k, heads[0] // heads[1], 2), np.repeat(v, r, 2), rep,
                     chunk_size=8)
        assert _rel(out, full) < 1e-12


@pytest.mark.parametrize("method", ["gla", "gated_deltanet", "kda"])
def test_gradients_equal_scan_reference_float32(method):
    q, k, v, kw = inputs(method, 3, batch=1, n=45, heads=(1, 1, 1))
    arrays = {n: jnp.asarray(x, jnp.float32) for n, x in kw.items() if isinstance(x, np.ndarray)}
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    cot = jax.random.normal(jax.random.key(0), (1, 45, 1, v.shape[-1]))

    delta = method in DELTA
    norm = {"qk_l2norm": True} if delta else {}

    def chunked(q, k, v, arrays):
        return jnp.sum(FUNCTIONS[method](q, k, v, chunk_size=16, **norm, **arrays) * cot)

    def scanned(q, k, v, arrays):
        qn, kn = q, k
        if delta:
            qn, kn = (x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6)
                      for x in (q, k))
        g = arrays["g"][0, :, 0]
        g = g[:, None] if g.ndim == 1 else g
        out, _ = rec.recurrent_reference(
            qn[0, :, 0][None], kn[0, :, 0], v[0, :, 0], g, arrays.get("beta", [None])[0][:, 0]
            if "beta" in arrays else None, jnp.zeros(45, bool),
            jnp.zeros((q.shape[-1], v.shape[-1])), scale=q.shape[-1] ** -0.5)
        return jnp.sum(out[0][None, :, None] * cot)

    got = jax.jit(jax.grad(chunked, argnums=(0, 1, 2, 3)))(q, k, v, arrays)
    want = jax.jit(jax.grad(scanned, argnums=(0, 1, 2, 3)))(q, k, v, arrays)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert _rel(a, b) < 1e-5


@pytest.mark.parametrize("method", ["gla", "gated_deltanet"])
def test_extreme_gates_stay_finite_and_accurate(method, float64):
    q, k, v, kw = inputs(method, 4, n=70, decay=(0.999, 1.0))
    g = kw["g"].copy()
    g[:, ::9] = -80.0        # decay near 0: the state is all but forgotten
    g[:, 3::7] = 0.0         # decay exactly 1
    kw["g"] = g
    if method in DELTA:
        kw["beta"][:, ::4] = 0.0
        kw["beta"][:, 1::4] = 1.0
    expected = numpy_recurrence(method, q, k, v, kw)
    out = _call(method, q, k, v, kw, chunk_size=16)
    assert _rel(out, expected) < 1e-10
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    kw32 = {n: (x.astype(np.float32) if isinstance(x, np.ndarray) else x) for n, x in kw.items()}
    with jax.enable_x64(False):
        out32 = _call(method, q32, k32, v32, kw32, chunk_size=16)
        grads = jax.jit(jax.grad(lambda q: jnp.sum(FUNCTIONS[method](
            q, jnp.asarray(k32), jnp.asarray(v32), chunk_size=16,
            **{n: x for n, x in kw32.items()}))))(jnp.asarray(q32))
    assert _rel(out32, expected) < 1e-5
    assert np.isfinite(np.asarray(grads)).all()


def test_long_sequence_float32_close_to_float64():
    q, k, v, kw = inputs("gated_deltanet", 5, batch=1, n=2000, heads=(1, 1, 1), d_k=8, d_v=8,
                         decay=(0.9, 1.0))
    with jax.enable_x64(True):
        expected = _call("gated_deltanet", q, k, v, kw)
    out = _call("gated_deltanet", *(x.astype(np.float32) for x in (q, k, v)),
                {n: (x.astype(np.float32) if isinstance(x, np.ndarray) else x)
                 for n, x in kw.items()})
    assert _rel(out, expected) < 1e-5


@pytest.mark.parametrize("method", ["simple_gla", "deltanet"])
def test_bf16_inputs_within_bf16_tolerance(method):
    q, k, v, kw = inputs(method, 6, n=64)
    arrays = {n: x.astype(np.float32) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    out32 = _call(method, *(x.astype(np.float32) for x in (q, k, v)), arrays)
    bf = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    out16 = _call(method, *bf, arrays)
    assert out16.dtype == jnp.bfloat16
    assert _rel(out16, out32) < 2e-2


def test_initial_and_final_state_continue_a_sequence(float64):
    q, k, v, kw = inputs("gated_deltanet", 7, n=40)
    full = _call("gated_deltanet", q, k, v, kw)
    first = {n: (x[:, :25] if isinstance(x, np.ndarray) and x.ndim > 1 else x)
             for n, x in kw.items()}
    rest = {n: (x[:, 25:] if isinstance(x, np.ndarray) and x.ndim > 1 else x)
            for n, x in kw.items()}
    out1, state = _call("gated_deltanet", q[:, :25], k[:, :25], v[:, :25], first,
                        return_final_state=True)
    assert state.shape == (2, 2, 6, 5)
    out2 = _call("gated_deltanet", q[:, 25:], k[:, 25:], v[:, 25:],
                 {**rest, "initial_state": np.asarray(state)})
    assert _rel(np.concatenate([out1, out2], 1), full) < 1e-12


def test_transition_composes_shards(float64):
    # S_end = M·S_0 + S_ext, the affine map the sequence-parallel prefix folds.
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 30, 4)), rng.normal(size=(30, 4)), rng.normal(size=(30, 3))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    g, beta = np.log(rng.uniform(0.8, 1, (30, 1))), rng.uniform(0, 1, 30)
    s0 = rng.normal(size=(4, 3))
    chunks, _ = _chunk.chunk_quantities(*(jnp.asarray(x) for x in (q, k, v, g, beta)),
                                        jnp.zeros(30, bool), scale=0.5, chunk_size=8)
    _, final = _chunk.run_chunks(chunks, jnp.asarray(s0))
    m, ext = _chunk.transition(chunks), _chunk.leaving_state(chunks)
    np.testing.assert_allclose(_chunk.apply_transition(m, s0) + ext, final, atol=1e-12)


@pytest.mark.parametrize("c", [1, 5, 16])
def test_unit_lower_inverse_and_its_gradient_float64(c, float64):
    # The UT transform's T = (I + L)^-1: the value, and the written-out gradient against
    # autodiff of a dense inverse, for a strictly lower L (C = 5 is padded to 8 inside).
    rng = np.random.default_rng(c)
    lower = jnp.asarray(np.tril(rng.normal(size=(c, c)) / c, -1))
    weights = jnp.asarray(rng.normal(size=(c, c)))
    dense = jnp.linalg.inv(jnp.eye(c) + lower)
    np.testing.assert_allclose(_chunk._unit_lower_inverse(lower), dense, atol=1e-13)
    grad = jax.grad(lambda x: jnp.sum(weights * _chunk._unit_lower_inverse(x)))(lower)
    want = jax.grad(lambda x: jnp.sum(weights * jnp.linalg.inv(jnp.eye(c) + x)))(lower)
    np.testing.assert_allclose(grad, np.tril(want, -1), atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda x: rec.gla_attention(x, x, x, g=jnp.full((1, 8, 2, 4), 0.5)), "`g` must lie in"),
    (lambda x: rec.gla_attention(x, x, x, g=jnp.zeros((1, 7, 2, 4))), "`g` must have shape"),
    (lambda x: rec.deltanet_attention(x, x, x, beta=jnp.full((1, 8, 2), 2.5)),
     "`beta` must lie in"),
    (lambda x: rec.gated_deltanet_attention(x, x, x, g=jnp.zeros((1, 8, 2, 4)),
                                            beta=jnp.ones((1, 8, 2))), "`g` must have shape"),
    (lambda x: rec.mamba2_attention(x, x, x, dt=jnp.ones((1, 8, 2)), A=jnp.ones(2)),
     "`A` must lie in"),
    (lambda x: rec.mamba2_attention(x, x, x, dt=jnp.full((1, 8, 2), -0.1), A=-jnp.ones(2)),
     "`dt` must lie in"),
    (lambda x: rec.retnet_attention(x, x, x[..., :1, :]), "heads must group"),
    (lambda x: rec.retnet_attention(x, x, x, segment_ids=jnp.zeros((1, 8))),
     "`segment_ids` must be an int array"),
    (lambda x: rec.retnet_attention(x, x, x, bias=jnp.zeros((1, 2, 8, 8))), "`bias`"),
])
def test_bad_arguments_name_the_argument(call, match):
    x = jnp.ones((1, 8, 2, 4))
    with pytest.raises(UsageError, match=match):
        call(x)


def test_non_causal_is_refused():
    x = jnp.ones((1, 8, 2, 4))
    with pytest.raises(UnsupportedError, match="is_causal=False"):
        rec.retnet_attention(x, x, x, is_causal=False)


def test_gradients_with_padding_and_segments_equal_the_scan_float64(float64):
    # Padded tokens are identity tokens (g = 0, β = 0, k = v = 0); segments reset the state.
    q, k, v, kw = inputs("gated_deltanet", 8, batch=1, n=30, heads=(1, 1, 1))
    valid = np.arange(30) < 26
    ids = np.repeat([[0, 1]], [13, 17], axis=1)
    mask = jnp.asarray(valid[None, None, :, None] & valid[None, None, None, :])
    g, beta = jnp.asarray(kw["g"]), jnp.asarray(kw["beta"])

    def chunked(q, k, v, g, beta):
        out = rec.gated_deltanet_attention(q, k, v, g=g, beta=beta, mask=mask, chunk_size=8,
                                           segment_ids=jnp.asarray(ids, jnp.int32))
        return jnp.sum(jnp.sin(out))

    def scanned(q, k, v, g, beta):
        qn, kn = (x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6) for x in (q, k))
        keep = jnp.asarray(valid)
        out, _ = rec.recurrent_reference(
            qn[0, :, 0][None], jnp.where(keep[:, None], kn[0, :, 0], 0.0),
            jnp.where(keep[:, None], v[0, :, 0], 0.0), jnp.where(keep, g[0, :, 0], 0.0)[:, None],
            jnp.where(keep, beta[0, :, 0], 0.0),
            jnp.asarray(np.r_[False, ids[0, 1:] != ids[0, :-1]]), jnp.zeros((6, 5)),
            scale=6 ** -0.5)
        return jnp.sum(jnp.sin(jnp.where(keep[:, None], out[0], 0.0)))

    args = tuple(jnp.asarray(x) for x in (q, k, v)) + (g, beta)
    got = jax.jit(jax.grad(chunked, argnums=(0, 1, 2, 3, 4)))(*args)
    want = jax.jit(jax.grad(scanned, argnums=(0, 1, 2, 3, 4)))(*args)
    for a, b in zip(got, want):
        assert _rel(a, b) < 1e-10
