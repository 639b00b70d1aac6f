"""Segment ids (packed sequences), registry-driven: for every method that declares them, a
packed row equals each document run alone (float64), with padding, causal and not; every
other method refuses them, naming those that take them; bad ids get a clear error."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS
from spectral_jax.attention.core._hints import functions_declaring

B, N, H, D = 2, 23, 2, 4
# Example 0: three documents and two padding tokens (id 0); example 1: two documents.
IDS = np.array([[1] * 7 + [2] * 9 + [3] * 5 + [0] * 2, [5] * 3 + [1] * 20])
LENGTHS = np.array([21, 23])
EXTRA = {"linear": {"chunk_size": 4}, "performer": {"chunk_size": 4}, "local": {"window": 3},
         "gla": {"chunk_size": 4}, "retnet": {"chunk_size": 4}, "mamba2": {"chunk_size": 4},
         "deltanet": {"chunk_size": 4}, "gated_deltanet": {"chunk_size": 4}}


def _declares(name: str) -> bool:
    fn = ATTENTIONS[name].fn
    return ("segment_ids" in inspect.signature(fn).parameters
            and "segment_ids" not in getattr(fn, "drop_in_added", frozenset()))


SEGMENTED = tuple(n for n in ATTENTIONS if _declares(n))
REFUSING = tuple(n for n in ATTENTIONS if n not in SEGMENTED)
RECURRENT = ("gla", "retnet", "mamba2", "deltanet", "gated_deltanet")


def test_the_methods_that_take_segment_ids():
    assert SEGMENTED == ("softmax", "linear", "performer", "local", *RECURRENT)


def _inputs(name: str, x64: bool = True):
    with jax.enable_x64(x64):
        q, k, v = (jax.random.normal(jax.random.key(i), (B, N, H, D),
                                     jnp.float64 if x64 else jnp.float32)
                   for i in range(3))
        spec = ATTENTIONS[name]
        kwargs = spec.call_kwargs(jax.random.key(5), budget=spec.test_budget, length=N,
                                  head_dim=D)
        kwargs = {n: (x.astype(q.dtype) if hasattr(x, "dtype")
                      and jnp.issubdtype(x.dtype, jnp.floating) else x)
                  for n, x in kwargs.items()}
    kwargs.update(EXTRA.get(name, {}))
    tokens = {}
    for arg, axis, batched in ATTENTIONS[name].token_arrays:
        if batched and arg in kwargs:
            x = kwargs.pop(arg)
            tokens[arg] = jnp.broadcast_to(x, (B, N, H, *x.shape[x.ndim + axis + 2:]))
    return q, k, v, kwargs, tokens


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", SEGMENTED)
def test_a_packed_row_equals_each_document_alone(name, is_causal):
    if name in RECURRENT and not is_causal:
        pytest.skip("the recurrent family is causal only")
    with jax.enable_x64(True):
        q, k, v, kwargs, tokens = _inputs(name)
        fn = jax.jit(functools.partial(ATTENTIONS[name].fn, **kwargs),
                     static_argnames=("is_causal",))
        lengths = jnp.asarray(LENGTHS)
        packed = fn(q, k, v, is_causal=is_causal, segment_ids=jnp.asarray(IDS),
                    query_seq_lengths=lengths, key_value_seq_lengths=lengths, **tokens)
        assert packed.dtype == jnp.float64
        # Each document alone: one row per document, at its start, right-padded (padding
        # and batch mates change no valid output, as the registry tests check).
        docs = [(b, np.flatnonzero((IDS[b] == doc) & (np.arange(N) < LENGTHS[b])))
                for b in range(B) for doc in np.unique(IDS[b, :LENGTHS[b]])]
        take = np.zeros((len(docs), N), int)
        for row, (b, idx) in enumerate(docs):
            take[row, :len(idx)] = b * N + idx
        gather = lambda x: x.reshape(B * N, *x.shape[2:])[take]  # noqa: E731
        sizes = jnp.asarray([len(idx) for _, idx in docs])
        alone = fn(gather(q), gather(k), gather(v), is_causal=is_causal,
                   query_seq_lengths=sizes, key_value_seq_lengths=sizes,
                   **{n: gather(x) for n, x in tokens.items()})
        # Bidirectional Performer adds eps to features whose key stabiliser is the whole
        # row's: equal up to that eps, not to rounding.
        tol = 1e-4 if name == "performer" and not is_causal else 1e-12
        for row, (b, idx) in enumerate(docs):
            np.testing.assert_allclose(packed[b, idx], alone[row, :len(idx)], rtol=0, atol=tol,
                                       err_msg=f"{name}: example {b}, tokens {idx}")
        for b in range(B):
            np.testing.assert_array_equal(packed[b, LENGTHS[b]:], 0.0)


@pytest.mark.parametrize("name", ("linear", "performer", "local", "gla", "deltanet"))
def test_gradients_through_segments_are_finite_and_stay_in_their_document(name):
    q, k, v, kwargs, tokens = _inputs(name, x64=False)
    ids = jnp.asarray(IDS)

    def first_document(k):  # example 0's first document only
        out = ATTENTIONS[name].fn(q, k, v, is_causal=True, segment_ids=ids, **kwargs,
                                  **tokens)
        return jnp.sum(out[0, :7])

    grad = jax.jit(jax.grad(first_document))(k)
    assert bool(jnp.isfinite(grad).all())
    assert float(jnp.abs(grad[0, :7]).max()) > 0
    np.testing.assert_array_equal(grad[0, 7:], 0.0)
    np.testing.assert_array_equal(grad[1], 0.0)


@pytest.mark.parametrize("name", ("linear", "performer", *RECURRENT))
def test_ids_that_come_back_are_refused_or_poisoned_under_jit(name):
    q, k, v, kwargs, tokens = _inputs(name, x64=False)
    back = np.array([[1] * 10 + [2] * 3 + [1] * 10, [4] * N])  # example 0: id 1 comes back
    call = lambda ids: ATTENTIONS[name].fn(q, k, v, is_causal=True, segment_ids=ids,  # noqa: E731
                                           **kwargs, **tokens)
    with pytest.raises(UsageError, match=r"examples \[0\] have a segment id that comes back"):
        call(jnp.asarray(back))
    out = jax.jit(call)(jnp.asarray(back))
    assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())


def test_softmax_segments_are_flax_equality_masks_even_when_an_id_comes_back():
    q, k, v, _, _ = _inputs("softmax", x64=False)
    back = jnp.asarray(np.array([[1] * 10 + [2] * 3 + [1] * 10] * B))
    mask = (back[:, None, :, None] == back[:, None, None, :])
    np.testing.assert_allclose(
        ATTENTIONS["softmax"].fn(q, k, v, segment_ids=back),
        ATTENTIONS["softmax"].fn(q, k, v, mask=mask), rtol=0, atol=1e-6)


def test_cross_attention_segments_for_softmax():
    q, k, v, _, _ = _inputs("softmax", x64=False)
    q_ids = jnp.asarray(np.array([[1] * 5 + [2] * 6] * B))
    k_ids = jnp.asarray(IDS)
    out = ATTENTIONS["softmax"].fn(q[:, :11], k, v, query_segment_ids=q_ids,
                                   kv_segment_ids=k_ids)
    mask = q_ids[:, None, :, None] == k_ids[:, None, None, :]
    np.testing.assert_allclose(out, ATTENTIONS["softmax"].fn(q[:, :11], k, v, mask=mask),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", REFUSING)
def test_methods_that_mix_the_whole_row_refuse_segment_ids(name):
    q, k, v, kwargs, tokens = _inputs(name, x64=False)
    with pytest.raises(UnsupportedError, match="Functions that take segment ids: "
                                               + functions_declaring("segment_ids")):
        ATTENTIONS[name].fn(q, k, v, segment_ids=jnp.asarray(IDS), **kwargs, **tokens)


@pytest.mark.parametrize("name", ("softmax", "linear", "local"))
def test_bad_segment_ids_name_the_argument_and_what_is_allowed(name):
    q, k, v, kwargs, _ = _inputs(name, x64=False)
    with pytest.raises(UsageError, match=r"`segment_ids` must be an int array of shape "
                                         r"\(batch\.\.\., length\) = \(2, 23\); got float32"):
        ATTENTIONS[name].fn(q, k, v, segment_ids=jnp.ones((B, N)), **kwargs)
    with pytest.raises(UsageError, match=r"`segment_ids` must be an int array .* \(2, 22\)"):
        ATTENTIONS[name].fn(q, k, v, segment_ids=jnp.ones((B, N - 1), int), **kwargs)
    with pytest.raises(UsageError, match=r"give either `segment_ids` .* not both"):
        ATTENTIONS[name].fn(q, k, v, segment_ids=jnp.asarray(IDS),
                            kv_segment_ids=jnp.asarray(IDS), **kwargs)
    with pytest.raises(UsageError, match=r"`query_segment_ids` and `kv_segment_ids` go "
                                         r"together; `kv_segment_ids` is None"):
        ATTENTIONS[name].fn(q, k, v, query_segment_ids=jnp.asarray(IDS), **kwargs)


def test_decoding_takes_segment_ids_only_where_the_state_resets():
    from spectral_jax.attention import decode_step, prefill
    q, k, v, _, _ = _inputs("softmax", x64=False)
    ids = jnp.asarray(IDS)
    with pytest.raises(UnsupportedError, match=r"`segment_ids` given, but the 'kv_cache' state"):
        prefill("softmax", q, k, v, max_length=N, segment_ids=ids)
    g = jnp.zeros((B, N, H, D))
    out, state = jax.jit(functools.partial(prefill, "gla", max_length=N + 1))(
        q, k, v, segment_ids=ids, g=g)
    # Example 1's second document (tokens 3..22) decodes as if alone.
    alone = jax.jit(functools.partial(ATTENTIONS["gla"].fn, is_causal=True))(
        q[:, 3:], k[:, 3:], v[:, 3:], g=g[:, 3:])
    np.testing.assert_allclose(out[1, 3:], alone[1], rtol=0, atol=1e-5)
    _, alone_state = jax.jit(functools.partial(prefill, "gla", max_length=N))(
        q[1:, 3:], k[1:, 3:], v[1:, 3:], g=g[1:, 3:])
    np.testing.assert_allclose(state.arrays["state"][1], alone_state.arrays["state"][0],
                               rtol=0, atol=1e-5)
    with pytest.raises(UsageError, match=r"decode_step\(\): `segment_ids` given"):
        decode_step(state, q[:, :1], k[:, :1], v[:, :1], g=g[:, :1], segment_ids=ids[:, :1])
