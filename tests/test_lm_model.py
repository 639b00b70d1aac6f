"""CausalLM: causal by value, cached decoding equal to the full forward for every method with
a decode form, generation equal to greedy re-forwarding, the next-token objective against a
float64 numpy reference, and the bad inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention import ATTENTIONS
from spectral_jax.lra.train.objectives import bits_per_byte, next_token_metrics
from spectral_jax.nn import CausalLM, TransformerConfig, generate

CAUSAL = sorted(name for name, spec in ATTENTIONS.items() if spec.supports_causal)
_KWARGS = {"local": {"window": 4}, "performer": {"num_features": 16}}


def _model(attention: str, positional: str = "learned", max_length: int = 16) -> CausalLM:
    config = TransformerConfig(
        vocab_size=11, num_classes=11, max_length=max_length, num_layers=2, embed_dim=16,
        num_heads=2, qkv_dim=16, mlp_dim=32, dropout_rate=0.0, is_causal=True,
        attention=attention, attention_kwargs=_KWARGS.get(attention, {}),
        positional=positional, embed_init_std=0.5)
    return CausalLM(config, rngs=nnx.Rngs(0))


def test_later_tokens_do_not_change_earlier_logits():
    model = _model("softmax")
    a = model(jnp.array([[3, 4, 5, 6, 7]]))
    b = model(jnp.array([[3, 4, 5, 9, 1]]))
    np.testing.assert_array_equal(a[:, :3], b[:, :3])
    assert float(jnp.abs(a[:, 3] - b[:, 3]).max()) > 1e-3


@pytest.mark.parametrize("attention", CAUSAL)
def test_prefill_then_steps_equal_full_forward(attention):
    model = _model(attention, "sinusoidal" if attention == "linear" else "learned")
    tokens = jnp.array(np.random.default_rng(0).integers(1, 11, (2, 12)), jnp.int32)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    model.init_cache((2, 12))
    step = nnx.jit(lambda m, t: m(t, decode=True))
    parts = [step(model, tokens[:, :5])]  # prefill of 5, then one token per call
    parts += [step(model, tokens[:, i:i + 1]) for i in range(5, 12)]
    np.testing.assert_allclose(jnp.concatenate(parts, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "linear", "local"])
def test_cached_greedy_generation_equals_argmax_of_full_reforward(attention):
    model = _model(attention)
    prompt = np.array([[3, 4, 5, 1, 2], [7, 7, 2, 9, 10]], np.int32)
    new = generate(model, prompt, 9)
    # The re-forward runs on a buffer of the final length: the model is causal, so the logits
    # at position i see tokens 0..i only, and one compiled call serves every step.
    forward = nnx.jit(lambda m, t: m(t))
    seq = np.zeros((2, 14), np.int32)
    seq[:, :5] = prompt
    for i in range(5, 14):
        seq[:, i] = np.asarray(jnp.argmax(forward(model, jnp.asarray(seq))[:, i - 1], axis=-1))
    np.testing.assert_array_equal(new, seq[:, 5:])


def test_sampling_is_seeded_and_respects_banned_tokens():
    model = _model("linear")
    prompt = np.array([[3, 4, 5]], np.int32)
    a = generate(model, prompt, 10, temperature=1.0, seed=1, banned_tokens=(0,))
    b = generate(model, prompt, 10, temperature=1.0, seed=1, banned_tokens=(0,))
    c = generate(model, prompt, 10, temperature=1.0, seed=2, banned_tokens=(0,))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any() and (a > 0).all()
    # At a temperature near 0 sampling is greedy.
    np.testing.assert_array_equal(generate(model, prompt, 10, temperature=1e-6),
                                  generate(model, prompt, 10))


def test_banned_tokens_must_be_ids_of_the_vocabulary_and_leave_one():
    model = _model("softmax", max_length=8)
    prompt = np.ones((1, 2), np.int32)
    # Banning all 11 ids leaves nothing to choose: greedy decoding returned id 0.
    with pytest.raises(UsageError, match=r"`banned_tokens` bans every token of the "
                                         r"vocabulary \(vocab_size=11\)"):
        generate(model, prompt, 1, banned_tokens=tuple(range(11)))
    # An id past the vocabulary raised a raw IndexError; a negative one was taken silently.
    for bad in (11, -1):
        with pytest.raises(UsageError, match=r"`banned_tokens` must be token ids in "
                                             r"\[0, vocab_size\) = \[0, 11\); got "
                                             rf"\[{bad}\] in \(3, {bad}\)"):
            generate(model, prompt, 1, banned_tokens=(3, bad))
    with pytest.raises(UsageTypeError, match=r"`banned_tokens` must be a sequence of int "
                                             r"token ids; got \(2.5,\)"):
        generate(model, prompt, 1, banned_tokens=(2.5,))


def test_next_token_objective_against_float64_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7))
    inputs = rng.integers(1, 7, (3, 6)).astype(np.int32)
    mask = np.ones((3, 6), bool)
    mask[1, 4:] = False  # a last window's padding
    inputs[1, 4:] = 0
    weight = np.array([1.0, 1.0, 0.0])  # a padding row of the last batch

    class Fixed:
        def __call__(self, x, deterministic):
            assert x.shape == (3, 5)
            return jnp.asarray(logits, jnp.float32)

    batch = {"inputs": jnp.asarray(inputs), "mask": jnp.asarray(mask),
             "weight": jnp.asarray(weight, jnp.float32)}
    loss, sums = next_token_metrics(Fixed(), batch, True)
    targets = inputs[:, 1:]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    w = (mask[:, 1:] & mask[:, :-1]) * weight[:, None]
    assert float(sums["count"]) == w.sum() == 8
    np.testing.assert_allclose(float(sums["loss_sum"]), (nll * w).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(loss), (nll * w).sum() / 8, rtol=1e-5)
    np.testing.assert_allclose(bits_per_byte(sums), (nll * w).sum() / 8 / np.log(2), rtol=1e-5)
    hits = (logits.argmax(-1) == targets) * w
    assert float(sums["correct"]) == hits.sum()


def test_bad_input():
    with pytest.raises(UsageError, match="is_causal must be True"):
        CausalLM(TransformerConfig(vocab_size=5, num_classes=5, max_length=8),
                 rngs=nnx.Rngs(0))
    with pytest.raises(UnsupportedError, match="nystrom"):
        _model("nystrom")
    model = _model("softmax", max_length=8)
    with pytest.raises(UsageError, match=r"prompt \(6 tokens\) and max_new_tokens=3 need 9 "
                                         r"positions; the model has max_length=8"):
        generate(model, np.ones((1, 6), np.int32), 3)
    with pytest.raises(UsageError, match="decode=True needs init_cache"):
        _model("softmax")(jnp.ones((1, 1), jnp.int32), decode=True)
    with pytest.raises(UsageError, match="max_length=9 is above"):
        model.init_cache((1, 9))
    model.init_cache((2, 4))
    with pytest.raises(UsageError, match="cache's batch=2"):
        model(jnp.ones((1, 1), jnp.int32), decode=True)
    model(jnp.ones((2, 3), jnp.int32), decode=True)
    with pytest.raises(UsageError, match="needs 5 positions, past the cache's max_length=4"):
        model(jnp.ones((2, 2), jnp.int32), decode=True)
    with pytest.raises(UsageError, match="temperature"):
        generate(model, np.ones((1, 2), np.int32), 1, temperature=-1.0)
    assert jax.numpy.issubdtype(generate(model, np.ones((1, 2), np.int32), 2).dtype,
                                jnp.integer)
