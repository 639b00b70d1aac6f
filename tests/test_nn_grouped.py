"""nn.MultiHeadAttention(num_kv_heads=...): grouped-query layers equal the layer with its
key/value projections repeated to every head, decode with a cache of the key/value heads,
and refuse the methods and options that have no grouped form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS
from spectral_jax.nn import MultiHeadAttention

H, HKV, E, N = 4, 2, 16, 12
GROUPED = tuple(n for n, s in ATTENTIONS.items()
                if s.state not in ("gates", "memory_conv") and s.layer is None)
KWARGS = {"nystrom": {"num_landmarks": 4}, "spectral_shift": {"num_landmarks": 4},
          "skyformer": {"num_landmarks": 4}, "performer": {"num_features": 16},
          "local": {"window": 3}, "clustered": {"num_clusters": 3},
          "improved_clustered": {"num_clusters": 3}, "probsparse": {"factor": 1},
          "linformer": {"proj_len": 4, "max_length": N},
          "inducing_points": {"num_inducing_points": 4}, "luna": {"packed_length": 4}}


# Layers called under nnx.jit: one compile per layer instead of every operation eagerly.
_CALL = nnx.jit(lambda layer, x: layer(x))


def _pair(name: str, is_causal: bool):
    kw = dict(attention=name, attention_kwargs=KWARGS.get(name), is_causal=is_causal,
              deterministic=True)
    grouped = MultiHeadAttention(H, E, num_kv_heads=HKV, rngs=nnx.Rngs(0), **kw)
    full = MultiHeadAttention(H, E, rngs=nnx.Rngs(0), **kw)
    full.query, full.out = grouped.query, grouped.out
    if grouped.state is not None:
        full.state = grouped.state
    for part in ("key", "value"):
        src, dst = getattr(grouped, part), getattr(full, part)
        dst.kernel.set_value(jnp.repeat(src.kernel[...], H // HKV, axis=1))
        dst.bias.set_value(jnp.repeat(src.bias[...], H // HKV, axis=0))
    return grouped, full


def test_the_grouped_layers():
    assert {"softmax", "nystrom", "linear", "performer", "local", "linformer", "luna",
            "inducing_points", "clustered", "probsparse"} <= set(GROUPED)


@pytest.mark.parametrize("name", GROUPED)
def test_a_grouped_layer_equals_its_repeated_heads(name):
    x = jax.random.normal(jax.random.key(1), (2, N, E))
    for is_causal in (False, True) if ATTENTIONS[name].supports_causal else (False,):
        if ATTENTIONS[name].causal_only and not is_causal:
            continue
        grouped, full = _pair(name, is_causal)
        assert grouped.key.kernel.shape == (E, HKV, E // H)
        out, ref = _CALL(grouped, x), _CALL(full, x)
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * float(jnp.abs(ref).max()),
                                   err_msg=f"{name}, is_causal={is_causal}")


@pytest.mark.parametrize("name", ("softmax", "linear", "performer", "local"))
def test_grouped_decoding_keeps_the_key_value_heads_and_equals_the_causal_run(name):
    x = jax.random.normal(jax.random.key(2), (2, N, E))
    grouped, full = _pair(name, True)
    expected = _CALL(grouped, x)
    sizes = []
    for layer in (grouped, full):
        layer.init_cache((2, N, E))
        sizes.append(layer.decode_state.get_value().nbytes)
    assert sizes[0] * (H // HKV) == sizes[1]
    step = nnx.jit(lambda m, t: m(t, decode=True))
    out = jnp.concatenate([step(grouped, x[:, t:t + 1]) for t in range(N)], axis=1)
    np.testing.assert_allclose(out, expected, rtol=0,
                               atol=2e-5 * float(jnp.abs(expected).max()))


def test_what_has_no_grouped_form_refuses_it():
    with pytest.raises(UsageError, match=r"`num_kv_heads` must divide num_heads=4 .*got 3"):
        MultiHeadAttention(H, E, num_kv_heads=3, attention="softmax", rngs=nnx.Rngs(0))
    for name, kw in (("memory_compressed", None), ("gated_linear", None), ("gla", None),
                     ("softmax", {"symmetric": True}),
                     ("nystrom", {"conv_kernel_size": 3})):
        with pytest.raises(UnsupportedError, match=r"num_kv_heads=2 < num_heads=4 .*layers "
                                                   r"with grouped heads"):
            MultiHeadAttention(H, E, num_kv_heads=HKV, attention=name, attention_kwargs=kw,
                               is_causal=name in ("gla", "gated_linear"), rngs=nnx.Rngs(0))
