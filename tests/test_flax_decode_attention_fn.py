"""Every registered function as ``attention_fn`` of Flax's own ``nnx.MultiHeadAttention`` in
decode mode: one query against the key/value cache, under the mask Flax builds, must give that
position of the causal run over the whole sequence; where it cannot, a clear error."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import (
    ATTENTIONS,
    cached_decode_hint,
    linear_attention,
    local_attention,
    performer_attention,
    softmax_attention,
)

B, N, H, D = 2, 11, 2, 4
E = H * D
# Small chunks and windows, so the causal scans cross chunks and the band is narrower than N.
EXTRA = {"linear": {"chunk_size": 4}, "performer": {"chunk_size": 4}, "local": {"window": 3}}
DECODE = tuple(n for n, s in ATTENTIONS.items() if s.cached_decode)


def _fn(name: str, **extra):
    spec = ATTENTIONS[name]
    kwargs = spec.call_kwargs(jax.random.key(3), budget=spec.test_budget, length=N, head_dim=D)
    return functools.partial(spec.fn, is_causal=True,
                             **{**kwargs, **EXTRA.get(name, {}), **extra})


def _decode_vs_full(name: str, *, pass_causal: bool, attention_fn=None
                    ) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(1), (B, N, E))
    if attention_fn is None:
        # is_causal=True with one query against the cache: the query is the last slot only
        # bottom-right (top-left, jax.nn's and Flax's own, puts it at slot 0).
        aligned = ({"causal_alignment": "bottom_right"}
                   if pass_causal and ATTENTIONS[name].cached_decode else {})
        attention_fn = _fn(name, **aligned)
    module = nnx.MultiHeadAttention(H, E, qkv_features=E, attention_fn=attention_fn,
                                    decode=False, rngs=nnx.Rngs(0))
    module.init_cache((B, N, E))
    # Flax passes its own is_causal (default False) to attention_fn, overriding the partial's.
    extra = {"is_causal": True} if pass_causal else {}
    # Jitted, as a generation loop runs it: one program for every step. Decoded first, so
    # that a refusal comes from the decode call, not from the full run.
    step = nnx.jit(lambda m, x: m(x, decode=True, **extra))
    steps = [step(module, x[:, t:t + 1]) for t in range(N)]
    full = nnx.jit(lambda m, x: m(x, decode=False, is_causal=True))(module, x)
    return jnp.concatenate(steps, axis=1), full


def test_registry_names_the_methods_that_decode():
    assert DECODE == ("softmax", "linear", "performer", "local")
    assert all(ATTENTIONS[n].supports_causal for n in DECODE)
    assert cached_decode_hint() == (
        "Functions that decode from a key/value cache: softmax_attention, linear_attention, "
        "performer_attention, local_attention.")


@pytest.mark.parametrize("name", tuple(ATTENTIONS))
@pytest.mark.parametrize("pass_causal", [True, False], ids=["is_causal", "mask_only"])
def test_every_method_decodes_as_flax_calls_it_or_refuses(name, pass_causal):
    # Flax's decode call: one query against its whole key/value cache, under a mask of the
    # written slots. A method either gives the causal run's row or refuses, naming those
    # that decode; its registry entry's cached_decode says which.
    if not ATTENTIONS[name].cached_decode:
        with pytest.raises(UsageError) as info:
            _decode_vs_full(name, pass_causal=pass_causal)
        assert str(info.value).endswith(cached_decode_hint())
        if ATTENTIONS[name].supports_causal:
            # It names the decoder that carries the method's own state.
            assert "spectral_jax.nn.MultiHeadAttention(decode=True)" in str(info.value)
        return
    decoded, full = _decode_vs_full(name, pass_causal=pass_causal)
    scale = float(jnp.max(jnp.abs(full)))
    # Bidirectional FAVOR+ adds eps to the features, its causal form does not: close, not equal.
    tol = 1e-4 if name == "performer" and not pass_causal else 1e-5
    np.testing.assert_allclose(np.asarray(decoded), np.asarray(full), rtol=0, atol=tol * scale)


@pytest.mark.parametrize("name", DECODE)
def test_decode_with_is_causal_and_default_alignment_is_flaxs_own(name):
    # Flax's decode step passing is_causal=True to its own dot_product_attention lines the
    # one query up with slot 0 (top-left); the methods do the same by default, not silently
    # something else. With every key seen, local's window is wide enough to be exact.
    extra = {"window": N} if name == "local" else {}
    ours, _ = _decode_vs_full(name, pass_causal=True, attention_fn=_fn(name, **extra))
    flax_own, _ = _decode_vs_full(name, pass_causal=True,
                                  attention_fn=nnx.dot_product_attention)
    if name in ("linear", "performer"):
        # A query that sees key 0 alone gets value 0, whatever the feature map.
        np.testing.assert_allclose(np.asarray(ours), np.asarray(flax_own), atol=1e-5)
    else:
        np.testing.assert_allclose(np.asarray(ours), np.asarray(flax_own), atol=1e-6)


def test_memory_compressed_refuses_the_flax_decode_call():
    with pytest.raises(UnsupportedError) as info:
        _decode_vs_full("memory_compressed", pass_causal=False)
    assert str(info.value) == (
        "memory_compressed_attention(): one query against 11 keys under a mask is the call "
        "Flax's MultiHeadAttention(decode=True) makes against its key/value cache, which "
        "this method cannot decode from: its causal form reads state that the cache does "
        "not hold; decode with spectral_jax.attention.decode_step or "
        "spectral_jax.nn.MultiHeadAttention(decode=True), which carry it. (One query "
        "attending to padded keys outside decoding: pass key_value_seq_lengths instead of "
        f"the mask.) {cached_decode_hint()}")


def _qkv(n: int = 20):
    ks = jax.random.split(jax.random.key(7), 3)
    return tuple(jax.random.normal(kk, (B, n, H, D)) for kk in ks)


@pytest.mark.parametrize("causal", [True, False])
def test_local_queries_end_aligned_with_last_valid_key(causal):
    q, k, v = _qkv()
    lengths = jnp.array([20, 13])
    # The last 4 queries sit at p - 3 .. p, p = length - 1 the last valid key of the example.
    short = local_attention(q[:, -4:], k, v, window=3, is_causal=causal,
                            key_value_seq_lengths=lengths, causal_alignment="bottom_right")
    pos = lengths[:, None] - 4 + jnp.arange(4)[None, :]  # (B, 4)
    offset = pos[:, :, None] - jnp.arange(20)[None, None, :]
    band = (jnp.abs(offset) <= 3) & (jnp.arange(20)[None, None, :] < lengths[:, None, None])
    if causal:
        band &= offset >= 0
    expect = softmax_attention(q[:, -4:], k, v, mask=band[:, None])
    np.testing.assert_allclose(np.asarray(short), np.asarray(expect), atol=1e-6)
    if causal:
        # Without padding the short call is the last rows of the causal full-length run.
        np.testing.assert_allclose(
            np.asarray(local_attention(q[:, -4:], k, v, window=3, is_causal=True,
                                       causal_alignment="bottom_right")),
            np.asarray(local_attention(q, k, v, window=3, is_causal=True)[:, -4:]), atol=1e-6)


@pytest.mark.parametrize("fn", [linear_attention, performer_attention], ids=lambda f: f.__name__)
def test_feature_methods_causal_queries_end_aligned(fn):
    q, k, v = _qkv()
    kwargs = {"chunk_size": 4}
    if fn is performer_attention:
        kwargs["projection"] = ATTENTIONS["performer"].make_state(
            jax.random.key(0), budget=16, length=20, head_dim=D)["projection"]
    full = fn(q, k, v, is_causal=True, **kwargs)
    short = fn(q[:, -5:], k, v, is_causal=True, causal_alignment="bottom_right", **kwargs)
    np.testing.assert_allclose(np.asarray(short), np.asarray(full[:, -5:]), rtol=1e-5,
                               atol=1e-6)


def test_local_more_queries_than_keys_bottom_right_is_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"q_len must be <= kv_len") as e:
        local_attention(q, k[:, :6], v[:, :6], is_causal=True, causal_alignment="bottom_right")
    assert "q_len=20 and kv_len=6" in str(e.value)
