"""Bad decoding input: methods without a causal form, shapes, lengths, a full cache, and
non-finite keys or values (refused eagerly; under jit the example turns NaN, not silent)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention import (
    check_decode_state,
    decode_step,
    init_decode_state,
    prefill,
)

B, P, H, D = 2, 4, 2, 4


def _qkv(n: int = P, seed: int = 0):
    return tuple(jax.random.normal(k, (B, n, H, D)) for k in jax.random.split(
        jax.random.key(seed), 3))


def test_a_method_without_a_causal_form_names_those_with_one():
    q, k, v = _qkv()
    with pytest.raises(UnsupportedError) as info:
        prefill("linformer", q, k, v, max_length=8)
    assert str(info.value) == (
        "prefill(): attention='linformer' has no causal form, so it cannot decode token by "
        "token. Methods that decode: softmax, linear, performer, gated_linear, "
        "memory_compressed, local, gla, retnet, mamba2, deltanet, gated_deltanet.")


def test_prompt_and_lengths_are_checked_against_the_cache():
    q, k, v = _qkv()
    with pytest.raises(UsageError, match=r"the prompt has 4 tokens, longer than the cache "
                                         r"\(max_length=3\)"):
        prefill("softmax", q, k, v, max_length=3)
    with pytest.raises(UsageError, match=r"`lengths` must lie in \[0, 4\].*\[2, 5\]"):
        prefill("softmax", q, k, v, max_length=8, lengths=jnp.array([2, 5]))
    with pytest.raises(UsageTypeError, match=r"unknown keyword\(s\) \['windw'\]"):
        prefill("local", q, k, v, max_length=8, windw=2)


def test_a_step_must_match_the_state_shape_and_its_window():
    q, k, v = _qkv()
    _, state = prefill("local", q, k, v, max_length=8, window=2)
    q1, k1, v1 = (x[:, :1] for x in (q, k, v))
    with pytest.raises(UsageError, match=r"built for batch \(2,\) and 2 key/value heads; got "
                                         r"value of shape \(1, 1, 2, 4\)"):
        decode_step(state, q1[:1], k1[:1], v1[:1], window=2)
    with pytest.raises(UsageError, match="one token per step"):
        decode_step(state, q, k, v, window=2)
    with pytest.raises(UsageError, match=r"holds 3 positions \(window=2\), but window=5"):
        decode_step(state, q1, k1, v1, window=5)


def test_a_step_past_max_length_is_refused():
    q, k, v = _qkv()
    _, state = prefill("linear", q, k, v, max_length=4, lengths=jnp.array([4, 2]))
    q1, k1, v1 = (x[:, :1] for x in (q, k, v))
    with pytest.raises(UsageError, match=r"examples \[0\] are at position 4: the cache holds "
                                         r"max_length=4"):
        decode_step(state, q1, k1, v1)
    # A padding token of the full example is no step: example 1 still decodes.
    out, state = decode_step(state, q1, k1, v1, valid=jnp.array([False, True]))
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(state.position, [4, 3])


@pytest.mark.parametrize("name", ["softmax", "linear"])
def test_a_nan_never_enters_a_state_silently(name):
    q, k, v = _qkv()
    bad_v = v.at[1, 0, 0, 0].set(jnp.nan)
    with pytest.raises(UsageError, match=r"examples \[1\] have a non-finite key, value or gate "
                                         "in their prompt"):
        prefill(name, q, k, bad_v, max_length=8)
    _, state = prefill(name, q, k, v, max_length=8)
    q1, k1, v1 = (x[:, :1] for x in (q, k, v))
    with pytest.raises(UsageError, match=r"examples \[0\] have a non-finite key, value or gate"):
        decode_step(state, q1, k1.at[0].set(jnp.inf), v1)
    # Under jit: not written, the example flagged, its outputs NaN from then on.
    step = jax.jit(decode_step)
    out, after = step(state, q1, k1.at[0].set(jnp.inf), v1)
    assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())
    np.testing.assert_array_equal(after.ok, [False, True])
    np.testing.assert_array_equal(after.position, [P, P + 1])
    for name_, array in after.arrays.items():
        assert bool(jnp.isfinite(array).all()), name_
    out, after = step(after, q1, k1, v1)
    assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())
    with pytest.raises(UsageError, match=r"examples \[0\] of the '" + name + "' state had a "
                                         "token refused"):
        check_decode_state(after)


def test_an_empty_state_needs_its_state_arguments():
    with pytest.raises(UsageError, match=r"attention='performer' needs \['projection'\]"):
        init_decode_state("performer", batch_shape=(B,), max_length=8, num_heads=H, head_dim=D)


@pytest.mark.parametrize("name", ["softmax", "local"])
def test_a_prompt_length_outside_the_prompt_is_flagged_under_jit(name):
    q, k, v = _qkv()
    q1, k1, v1 = (x[:, :1] for x in (q, k, v))
    run = jax.jit(lambda q, k, v, lengths: prefill(name, q, k, v, max_length=P + 4,
                                                   lengths=lengths))
    step = jax.jit(decode_step)
    # Example 0 claims more tokens than the prompt has, or fewer than none: its state would
    # hold slots that were never written, so it is flagged as for a refused token.
    for bad in (P + 3, -1):
        out, state = run(q, k, v, jnp.array([bad, 2]))
        np.testing.assert_array_equal(state.ok, [False, True])
        assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())
        out, after = step(state, q1, k1, v1)
        assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())
        np.testing.assert_array_equal(after.ok, [False, True])
        with pytest.raises(UsageError, match=r"examples \[0\] of the '" + name + "' state had "
                                             r"a token refused: .*a prompt length outside"):
            check_decode_state(after)
