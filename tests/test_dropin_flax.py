"""The drop-in contract with Flax: every method as the ``attention_fn`` of Linen's and NNX's
own attention modules applies the dropout and sows the weights those modules ask for, or
raises; nothing they pass is silently dropped."""

from __future__ import annotations

import functools

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import NAMES, method_kwargs
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS, softmax_attention

B, N, H, D = 2, 8, 2, 4
E = H * D
RATE = 0.4
DROPS = tuple(n for n in NAMES if ATTENTIONS[n].weight_dropout)


def _fn(name: str):
    fn = functools.partial(ATTENTIONS[name].fn, **method_kwargs(name, n=N, head_dim=D))
    # Linen passes only the keywords the signature names; a partial keeps the signature.
    return functools.wraps(ATTENTIONS[name].fn)(fn)


def _causal_only(name: str) -> bool:
    """The recurrences, causal by construction: called with is_causal=True."""
    return name == "gated_linear" or ".recurrent." in ATTENTIONS[name].fn.__module__


def _x():
    return jax.random.normal(jax.random.key(0), (B, N, E))


def test_only_softmax_drops_weights():
    assert DROPS == ("softmax",)


def _linen(attention_fn, **fields):
    return linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E,
                                              attention_fn=attention_fn, dropout_rate=RATE,
                                              **fields)


@pytest.mark.parametrize("name", NAMES)
def test_linen_dropout_applies_or_raises(name):
    x = _x()
    fn = _fn(name)
    if _causal_only(name):
        fn = functools.wraps(ATTENTIONS[name].fn)(functools.partial(fn, is_causal=True))
    mask = None
    module = _linen(fn)
    params = module.init(jax.random.key(1), x, mask=mask, deterministic=True)
    off = module.apply(params, x, mask=mask, deterministic=True)
    # Rate 0 with deterministic=False is off, for every method.
    zero = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, attention_fn=fn,
                                              dropout_rate=0.0)
    np.testing.assert_array_equal(
        np.asarray(zero.apply(params, x, mask=mask, deterministic=False,
                              rngs={"dropout": jax.random.key(2)})), np.asarray(off))
    if name not in DROPS:
        with pytest.raises(NotImplementedError, match="dropout"):
            module.apply(params, x, mask=mask, deterministic=False,
                         rngs={"dropout": jax.random.key(2)})
        return
    on = module.apply(params, x, mask=mask, deterministic=False,
                      rngs={"dropout": jax.random.key(2)})
    assert float(jnp.max(jnp.abs(on - off))) > 1e-2
    # The same masks as Flax's own attention for the same rng: the module outputs agree.
    flax_own = _linen(linen.dot_product_attention).apply(
        params, x, mask=mask, deterministic=False, rngs={"dropout": jax.random.key(2)})
    np.testing.assert_allclose(np.asarray(on), np.asarray(flax_own), atol=1e-5)


@pytest.mark.parametrize("broadcast", [True, False])
def test_softmax_dropout_masks_are_flaxs_for_the_same_rng(broadcast):
    ks = jax.random.split(jax.random.key(3), 3)
    q, k, v = (jax.random.normal(kk, (B, N, H, D)) for kk in ks)
    kw = {"dropout_rng": jax.random.key(4), "dropout_rate": RATE, "deterministic": False,
          "broadcast_dropout": broadcast}
    ours = softmax_attention(q, k, v, **kw)
    for flax_fn in (nnx.dot_product_attention, linen.dot_product_attention):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(flax_fn(q, k, v, **kw)),
                                   atol=1e-5)


def _nnx(attention_fn):
    return nnx.MultiHeadAttention(H, E, qkv_features=E, attention_fn=attention_fn,
                                  decode=False, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", NAMES)
def test_nnx_sow_weights_sows_or_raises(name):
    x = _x()
    mask = None
    fn = _fn(name)
    if _causal_only(name):
        fn = functools.partial(fn, is_causal=True)
    module = _nnx(fn)
    if name not in DROPS:
        with pytest.raises(UnsupportedError, match="sow_weights=True"):
            module(x, mask=mask, sow_weights=True, deterministic=True)
        return
    ours = module(x, mask=mask, sow_weights=True, deterministic=True)
    flax_own = _nnx(nnx.dot_product_attention)
    nnx.update(flax_own, nnx.state(module, nnx.Param))
    want = flax_own(x, mask=mask, sow_weights=True, deterministic=True)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(want), atol=1e-6)
    got_w = nnx.state(module, nnx.Intermediate)["attention_weights"]
    want_w = nnx.state(flax_own, nnx.Intermediate)["attention_weights"]
    np.testing.assert_allclose(np.asarray(jax.tree.leaves(got_w)[0]),
                               np.asarray(jax.tree.leaves(want_w)[0]), atol=1e-6)


def test_linen_sow_weights_sows_softmax_weights():
    x = _x()
    module = _linen(_fn("softmax"))
    params = module.init(jax.random.key(1), x, deterministic=True)
    _, state = module.apply(params, x, deterministic=True, sow_weights=True,
                            mutable=["intermediates"])
    _, want = _linen(linen.dot_product_attention).apply(
        params, x, deterministic=True, sow_weights=True, mutable=["intermediates"])
    np.testing.assert_allclose(
        np.asarray(state["intermediates"]["attention_weights"][0]),
        np.asarray(want["intermediates"]["attention_weights"][0]), atol=1e-6)


CAUSAL = tuple(n for n in NAMES if ATTENTIONS[n].supports_causal)


@pytest.mark.parametrize("name", CAUSAL)
def test_flax_causal_mask_with_is_causal_is_its_padding(name):
    # A Flax model's causal mask combined with padding, passed with is_causal=True: only the
    # causal triangle is read, so the call equals the same call with sequence lengths,
    # concrete or traced under jit (a traced non-padding mask would give NaN).
    n = 12
    ks = jax.random.split(jax.random.key(5), 3)
    q, k, v = (jax.random.normal(kk, (B, n, H, D)) for kk in ks)
    lengths = jnp.array([n, 7])
    valid = jnp.arange(n)[None, :] < lengths[:, None]
    mask = nnx.combine_masks(nnx.make_causal_mask(valid), nnx.make_attention_mask(valid, valid))
    fn = functools.partial(ATTENTIONS[name].fn, **method_kwargs(name, n=n, head_dim=D),
                           is_causal=True)
    want = fn(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    np.testing.assert_allclose(np.asarray(fn(q, k, v, mask=mask)), np.asarray(want),
                               atol=1e-5)
    traced = jax.jit(lambda q, k, v, m: fn(q, k, v, mask=m))(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(want), atol=1e-5)
    if name != "softmax":
        # Inside the triangle the mask must still be padding: a band is refused.
        band = jnp.arange(n)[:, None] - jnp.arange(n)[None, :] <= 2
        with pytest.raises(UsageError, match="must be a padding mask"):
            fn(q, k, v, mask=mask.astype(bool) & band)
