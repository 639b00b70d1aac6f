"""The drop-in contract with ``jax.nn.dot_product_attention``: its keywords, its top-left
causal alignment at unequal lengths, and its sequence lengths under any rank promotion."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import CAUSAL, NAMES, method_kwargs
from numpy_reference import elu1

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS, linear_attention, local_attention, softmax_attention

B, H, D = 2, 2, 8
# The recurrences (gated linear and the linear-recurrent family) are causal by construction
# and read one key per query; memory compression refuses unequal causal lengths (tested where
# they live). The other causal methods take any pair of lengths.
RECURRENT = tuple(n for n in CAUSAL if ".recurrent." in ATTENTIONS[n].fn.__module__
                  or n == "gated_linear")
UNEQUAL = tuple(n for n in CAUSAL if n not in RECURRENT and n != "memory_compressed")


def _qkv(q_len: int, kv_len: int, seed: int = 0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ks[0], (B, q_len, H, D)),
            jax.random.normal(ks[1], (B, kv_len, H, D)),
            jax.random.normal(ks[2], (B, kv_len, H, D)))


def _sees(q_len: int, kv_len: int, *, causal=False, window=None, mask=None,
          q_lengths=None, kv_lengths=None) -> jax.Array:
    """bool ``(B, q_len, H, 1)``: the query rows that see at least one key (top-left)."""
    sees = jnp.ones((B, H, q_len, kv_len), bool)
    off = jnp.arange(q_len)[:, None] - jnp.arange(kv_len)[None, :]
    if mask is not None:
        sees &= mask
    if causal:
        sees &= off >= 0
    if window is not None:
        left, right = (window, window) if isinstance(window, int) else window
        sees &= (off <= left) & (off >= -right)
    if q_lengths is not None:
        sees &= (jnp.arange(q_len)[None, :, None] < q_lengths[:, None, None])[:, None]
    if kv_lengths is not None:
        sees &= (jnp.arange(kv_len)[None, None, :] < kv_lengths[:, None, None])[:, None]
    return jnp.swapaxes(sees.any(-1), 1, 2)[..., None]


def _assert_jax_nn(got, want, rows, atol=1e-6, err_msg=""):
    """``got`` equals jax.nn's ``want`` on the rows that see a key and is zero elsewhere
    (where jax.nn averages every value; a query with no key gives zeros here)."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.where(rows, want, 0.0)),
                               atol=atol, err_msg=err_msg)


def _fn(name: str, n: int):
    return functools.partial(ATTENTIONS[name].fn, **method_kwargs(name, n=n, head_dim=D))


def test_unequal_families_are_the_expected_ones():
    assert set(UNEQUAL) == {"softmax", "linear", "performer", "local"}


@pytest.mark.parametrize(("q_len", "kv_len"), [(3, 6), (6, 3), (5, 5)])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "seq_lengths"])
def test_softmax_is_causal_is_jax_nn_at_every_pair_of_lengths(q_len, kv_len, lengths):
    q, k, v = _qkv(q_len, kv_len)
    kw = ({"query_seq_lengths": jnp.array([q_len, max(1, q_len - 2)]),
           "key_value_seq_lengths": jnp.array([kv_len, max(1, kv_len - 1)])} if lengths else {})
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True, **kw)
    got = softmax_attention(q, k, v, is_causal=True, **kw)
    if lengths:
        # jax.nn leaves padded query rows as they fall; ours are zero (a query with no key).
        rows = jnp.arange(q_len)[None, :, None, None] < kw["query_seq_lengths"][:, None, None,
                                                                                None]
        want = jnp.where(rows, want, 0.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


def _linear_top_left_f64(q, k, v, eps=1e-6):
    """Float64 causal linear attention, top-left: query i sees keys j <= i."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    allowed = np.arange(q.shape[1])[:, None] >= np.arange(k.shape[1])[None, :]
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            w = (elu1(q[b, :, h]) @ elu1(k[b, :, h]).T) * allowed
            out[b, :, h] = (w @ v[b, :, h]) / (w.sum(-1, keepdims=True) + eps)
    return out


@pytest.mark.parametrize(("q_len", "kv_len"), [(3, 9), (9, 3)])
def test_linear_is_causal_top_left_is_the_float64_reference(q_len, kv_len):
    q, k, v = _qkv(q_len, kv_len, seed=1)
    got = linear_attention(q, k, v, is_causal=True, chunk_size=4)
    np.testing.assert_allclose(np.asarray(got), _linear_top_left_f64(q, k, v), atol=2e-5)


@pytest.mark.parametrize(("q_len", "kv_len"), [(4, 10), (10, 4)])
def test_local_full_window_is_causal_is_jax_nn(q_len, kv_len):
    # A window covering every key makes local attention exact softmax.
    q, k, v = _qkv(q_len, kv_len, seed=2)
    got = local_attention(q, k, v, window=10, is_causal=True)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


@pytest.mark.parametrize("name", UNEQUAL)
def test_top_left_at_unequal_lengths_is_the_square_run_cut(name):
    # Top-left: fewer queries are the first rows of the square causal run; fewer keys are
    # the square run with the missing keys marked invalid.
    n, m = 12, 5
    q, k, v = _qkv(n, n, seed=3)
    fn = _fn(name, n)
    square = fn(q, k, v, is_causal=True)
    np.testing.assert_allclose(np.asarray(fn(q[:, :m], k, v, is_causal=True)),
                               np.asarray(square[:, :m]), atol=2e-5)
    np.testing.assert_allclose(
        np.asarray(fn(q, k[:, :m], v[:, :m], is_causal=True)),
        np.asarray(fn(q, k, v, is_causal=True, key_value_seq_lengths=jnp.full((B,), m))),
        atol=2e-5)


@pytest.mark.parametrize("name", UNEQUAL)
def test_bottom_right_is_the_last_rows_of_the_square_run(name):
    n, m = 12, 5
    q, k, v = _qkv(n, n, seed=4)
    fn = _fn(name, n)
    got = fn(q[:, -m:], k, v, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(q, k, v, is_causal=True)[:, -m:]),
                               atol=2e-5)


@pytest.mark.parametrize("name", UNEQUAL)
def test_unknown_alignment_is_refused(name):
    q, k, v = _qkv(6, 6)
    with pytest.raises(UsageError, match=r"`causal_alignment` must be one of \['top_left', "
                                         r"'bottom_right'\]; got 'end'"):
        _fn(name, 6)(q, k, v, is_causal=True, causal_alignment="end")


WINDOWS = [1, (2, 0), (0, 3), (1, 2), (0, 0)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "kv_len"), [(9, 9), (5, 9), (9, 5)])
def test_local_window_size_is_jax_nns(window, causal, q_len, kv_len):
    q, k, v = _qkv(q_len, kv_len, seed=5)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window)
    rows = _sees(q_len, kv_len, causal=causal, window=window)
    for fn in (softmax_attention, local_attention):
        got = fn(q, k, v, is_causal=causal, local_window_size=window)
        _assert_jax_nn(got, want, rows, err_msg=fn.__name__)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_takes_jax_nns_keywords_as_none(name):
    n = 16
    q, k, v = _qkv(n, n, seed=6)
    fn = _fn(name, n)
    base = fn(q, k, v)
    for extra in ({"local_window_size": None}, {"implementation": None},
                  {"implementation": "xla"}):
        np.testing.assert_array_equal(np.asarray(fn(q, k, v, **extra)), np.asarray(base))
    if name not in ("softmax", "local"):
        with pytest.raises(UnsupportedError, match=r"`local_window_size` must be None .*got "
                                                   r"\(2, 2\).*softmax_attention and "
                                                   r"local_attention"):
            fn(q, k, v, local_window_size=(2, 2))
    if name != "softmax":
        with pytest.raises(UsageError, match=r"`implementation` must be None or 'xla'.*got "
                                             r"'cudnn'"):
            fn(q, k, v, implementation="cudnn")


@pytest.mark.parametrize("bad", [-1, (1, 2, 3), (1.5, 2), "wide", (True, 1)], ids=str)
def test_bad_window_is_refused(bad):
    q, k, v = _qkv(6, 6)
    for fn in (softmax_attention, local_attention):
        with pytest.raises(UsageError, match=r"`local_window_size` must be None, an int w >= 0 "
                                             r"or a pair"):
            fn(q, k, v, local_window_size=bad)


@pytest.mark.parametrize("name", NAMES)
def test_sequence_lengths_and_masks_under_rank_promotion_raise(name):
    # jax_numpy_rank_promotion='raise' (what many codebases set) must not break the
    # lengths, the masks or the methods' own broadcasting.
    n = 16
    q, k, v = _qkv(n, n, seed=7)
    lengths = jnp.array([n, 11])
    valid = jnp.arange(n)[None, :] < lengths[:, None]
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    fn = _fn(name, n)
    causal = ATTENTIONS[name].supports_causal
    always = name in RECURRENT
    calls = [({"query_seq_lengths": lengths, "key_value_seq_lengths": lengths}, always),
             ({"mask": mask}, always), ({"key_value_seq_lengths": lengths}, causal)]
    want = [jax.jit(functools.partial(fn, is_causal=c))(q, k, v, **kw) for kw, c in calls]
    # Traced under the setting (a fresh jit traces again): every broadcast the call makes
    # is checked there, as an eager call would check it.
    with jax.numpy_rank_promotion("raise"):
        for (kw, c), w in zip(calls, want, strict=True):
            jitted = jax.jit(functools.partial(fn, is_causal=c))
            np.testing.assert_array_equal(np.asarray(jitted(q, k, v, **kw)), np.asarray(w))


BIAS_MASK = [
    ("none", None, None), ("bias_bhts", (B, H, 6, 9), None), ("bias_1hts", (1, H, 6, 9), None),
    ("bias_ts", (6, 9), None), ("mask_b1ts", None, (B, 1, 6, 9)), ("mask_ts", None, (6, 9)),
    ("both", (B, H, 6, 9), (B, 1, 6, 9)),
]


@pytest.mark.parametrize(("case", "bias_shape", "mask_shape"), BIAS_MASK,
                         ids=[c[0] for c in BIAS_MASK])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, (3, 1)], ids=["nowin", "win"])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
def test_softmax_equals_jax_nn_on_jaxs_argument_combinations(case, bias_shape, mask_shape,
                                                             causal, window, lengths):
    # The combinations jax's own tests of dot_product_attention use: bias and mask at the
    # shapes it broadcasts, causal, windowed, with sequence lengths, all at q_len != kv_len.
    q, k, v = _qkv(6, 9, seed=8)
    ks = jax.random.split(jax.random.key(9), 2)
    kw = {}
    if bias_shape:
        kw["bias"] = jax.random.normal(ks[0], bias_shape)
    if mask_shape:
        kw["mask"] = jax.random.bernoulli(ks[1], 0.7, mask_shape)
    if lengths:
        kw["query_seq_lengths"] = jnp.array([6, 4])
        kw["key_value_seq_lengths"] = jnp.array([9, 5])
    want = jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window,
                                        **kw)
    got = softmax_attention(q, k, v, is_causal=causal, local_window_size=window, **kw)
    rows = _sees(6, 9, causal=causal, window=window, mask=kw.get("mask"),
                 q_lengths=kw.get("query_seq_lengths"), kv_lengths=kw.get("key_value_seq_lengths"))
    _assert_jax_nn(got, want, rows, atol=1e-5)
