"""nn.MultiHeadAttention(num_kv_heads=...): grouped-query layers equal the layer with its
key/value projections (and the parts acting on keys: gates, memory convolutions, the
recurrent layer's short convolution) repeated to every head, decode with a cache of the
key/value heads, and refuse the options that have no grouped form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from layer_cases import apply_jitted

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS, STATE_KINDS
from spectral_jax.nn import MultiHeadAttention

H, HKV, E, N = 4, 2, 16, 12
PER_KEY_HEAD = {k for k, kind in STATE_KINDS.items() if kind.per_key_head}
# RetNet's decay is set by the head's index, so repeated heads are another layer.
GROUPED = tuple(n for n in ATTENTIONS if n != "retnet")
KWARGS = {"nystrom": {"num_landmarks": 4}, "spectral_shift": {"num_landmarks": 4},
          "skyformer": {"num_landmarks": 4}, "performer": {"num_features": 16},
          "local": {"window": 3}, "clustered": {"num_clusters": 3},
          "improved_clustered": {"num_clusters": 3}, "probsparse": {"factor": 1},
          "linformer": {"proj_len": 4, "max_length": N},
          "inducing_points": {"num_inducing_points": 4}, "luna": {"packed_length": 4}}


def _repeated(path: tuple, x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A grouped layer's parameter as the repeated-heads layer holds it."""
    if x.shape == shape:
        return x
    if path[0] == "layer_parts":  # short conv channels: q (H·d), then k and v (H_kv·d each)
        d = E // H
        x = x.reshape(x.shape[0], H + 2 * HKV, d)
        parts = [x[:, :H], x[:, H:H + HKV], x[:, H + HKV:]]
        parts[1:] = [jnp.repeat(p, H // HKV, axis=1) for p in parts[1:]]
        return jnp.concatenate(parts, axis=1).reshape(shape)
    axis = next(i for i, (a, b) in enumerate(zip(x.shape, shape)) if a != b)
    return jnp.repeat(x, shape[axis] // x.shape[axis], axis=axis)


def _pair(name: str, is_causal: bool):
    kw = dict(attention=name, attention_kwargs=KWARGS.get(name), is_causal=is_causal,
              deterministic=True)
    grouped = MultiHeadAttention(H, E, num_kv_heads=HKV, rngs=nnx.Rngs(0), **kw)
    full = MultiHeadAttention(H, E, rngs=nnx.Rngs(0), **kw)
    if grouped.state is not None and ATTENTIONS[name].state not in PER_KEY_HEAD:
        full.state = grouped.state  # the same random features or learned summaries
    params = nnx.to_flat_state(nnx.state(grouped, nnx.Variable))
    flat = nnx.to_flat_state(nnx.state(full, nnx.Variable))
    for path, var in flat:
        var.set_value(_repeated(path, dict(params)[path][...], var.shape))
    nnx.update(full, nnx.from_flat_state(flat))
    return grouped, full


def test_every_state_acting_on_keys_is_per_key_head():
    assert PER_KEY_HEAD == {"gates", "memory_conv", "log_decay", "delta", "gated_delta", "ssd"}


@pytest.mark.parametrize("name", GROUPED)
def test_a_grouped_layer_equals_its_repeated_heads(name):
    x = jax.random.normal(jax.random.key(1), (2, N, E))
    for is_causal in (False, True) if ATTENTIONS[name].supports_causal else (False,):
        if ATTENTIONS[name].causal_only and not is_causal:
            continue
        grouped, full = _pair(name, is_causal)
        assert grouped.key.kernel.shape == (E, HKV, E // H)
        out, ref = apply_jitted(grouped, x), apply_jitted(full, x)
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * float(jnp.abs(ref).max()),
                                   err_msg=f"{name}, is_causal={is_causal}")


@pytest.mark.parametrize("name", ("softmax", "linear", "performer", "local", "gated_linear",
                                  "memory_compressed", "gla", "gated_deltanet"))
def test_grouped_decoding_keeps_the_key_value_heads_and_equals_the_causal_run(name):
    x = jax.random.normal(jax.random.key(2), (2, N, E))
    grouped, full = _pair(name, True)
    expected = apply_jitted(grouped, x)
    sizes = []
    for layer in (grouped, full):
        layer.init_cache((2, N, E))
        sizes.append(layer.decode_state.nbytes)
    assert sizes[0] * (H // HKV) == sizes[1]
    step = nnx.jit(lambda m, t: m(t, decode=True))
    out = jnp.concatenate([step(grouped, x[:, t:t + 1]) for t in range(N)], axis=1)
    np.testing.assert_allclose(out, expected, rtol=0,
                               atol=2e-5 * float(jnp.abs(expected).max()))


def test_what_has_no_grouped_form_refuses_it():
    with pytest.raises(UsageError, match=r"`num_kv_heads` must divide num_heads=4 .*got 3"):
        MultiHeadAttention(H, E, num_kv_heads=3, attention="softmax", rngs=nnx.Rngs(0))
    for name, kw in (("softmax", {"symmetric": True}), ("nystrom", {"conv_kernel_size": 3})):
        with pytest.raises(UnsupportedError, match=r"num_kv_heads=2 < num_heads=4 with "
                                                   r"\['(symmetric|conv_kernel_size)'\]"):
            MultiHeadAttention(H, E, num_kv_heads=HKV, attention=name, attention_kwargs=kw,
                               rngs=nnx.Rngs(0))
