"""Registry-driven properties that every attention method must have: masks, batching, transforms."""

from __future__ import annotations

import functools
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import (
    APPROXIMATE,
    CAUSAL,
    NAMES,
    NON_CAUSAL,
    method_kwargs,
    padding_mask,
    qkv,
)

from spectral_jax.attention import (
    ATTENTIONS,
    get_attention,
    resolve_head_chunk_size,
    spectral_shift_delta,
)

B, N, H, D = 2, 48, 2, 8


def _call(name, q, k, v, **extra):
    kw = method_kwargs(name, n=k.shape[-3], head_dim=q.shape[-1]) | extra
    return get_attention(name)(q, k, v, **kw)


@functools.cache
def _programs(name, n, head_dim, static):
    """name's call and its pullback, jitted once per length, head_dim and static keywords.

    The tests compare outputs at one shape over many inputs and masks: the arrays are traced
    arguments, so every test that calls the method at that shape runs the same compiled
    program (compiling dominates the suite's time; eager calls compile op by op).
    """
    kw = method_kwargs(name, n=n, head_dim=head_dim) | dict(static)
    fn = get_attention(name)

    def attention(q, k, v, **arrays):
        return fn(q, k, v, **kw, **arrays)

    def pullback(q, k, v, cotangent, **arrays):
        out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, **arrays), q, k, v)
        return out, vjp(cotangent)

    return jax.jit(attention), jax.jit(pullback)


def _split(extra):
    static = tuple(sorted((key, x) for key, x in extra.items() if not isinstance(x, jax.Array)))
    return static, {key: x for key, x in extra.items() if isinstance(x, jax.Array)}


def _jcall(name, q, k, v, **extra):
    """_call, jitted: array keywords are traced, the others are part of the program."""
    static, arrays = _split(extra)
    return _programs(name, k.shape[-3], q.shape[-1], static)[0](q, k, v, **arrays)


def _jgrad(name, q, k, v, cotangent, **extra):
    """The output and the gradients of sum(output * cotangent) w.r.t. (q, k, v), jitted."""
    static, arrays = _split(extra)
    return _programs(name, k.shape[-3], q.shape[-1], static)[1](q, k, v, cotangent, **arrays)


def _jout(name, q, k, v, **extra):
    """_jcall's output from the pullback program, where a gradient test compiles it anyway."""
    return _jgrad(name, q, k, v, jnp.zeros(q.shape[:-1] + v.shape[-1:], q.dtype), **extra)[0]


@pytest.fixture(scope="module")
def inputs():
    q, k, v = qkv(0, (B, N, H, D))
    # Example 0 has 30 valid tokens followed by padding; example 1 is full.
    valid = jnp.arange(N)[None, :] < jnp.array([[30], [N]])
    return q, k, v, valid


@pytest.mark.parametrize("name", NAMES)
def test_padded_content_never_reaches_valid_outputs(name, inputs):
    q, k, v, valid = inputs
    mask = padding_mask(valid)
    noise = 100.0 * jax.random.normal(jax.random.key(9), (3, B, N, H, D))
    pad = ~valid[:, :, None, None]
    out_zero = _jout(name, *(jnp.where(pad, 0.0, x) for x in (q, k, v)), mask=mask)
    out_noise = _jout(name, *(jnp.where(pad, r, x) for x, r in zip((q, k, v), noise)), mask=mask)
    assert np.isfinite(np.asarray(out_noise)).all()
    sel = np.asarray(valid)
    chex.assert_trees_all_close(
        np.asarray(out_zero)[sel], np.asarray(out_noise)[sel], atol=1e-5, rtol=1e-5
    )
    # Padded query rows are zero.
    np.testing.assert_array_equal(np.asarray(out_noise)[~sel], 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_padded_content_never_reaches_valid_outputs(name, inputs):
    # Uninitialised buffers can hold inf or NaN: 0 * inf in P @ V must not leak into outputs.
    q, k, v, valid = inputs
    mask = padding_mask(valid)
    pad = ~valid[:, :, None, None]
    out_zero = _jout(name, *(jnp.where(pad, 0.0, x) for x in (q, k, v)), mask=mask)
    for fill in (jnp.inf, jnp.nan):
        out = _jout(name, *(jnp.where(pad, fill, x) for x in (q, k, v)), mask=mask)
        sel = np.asarray(valid)
        chex.assert_trees_all_close(
            np.asarray(out)[sel], np.asarray(out_zero)[sel], atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("name", NAMES)
def test_gradients_wrt_padded_inputs_are_zero_and_finite(name, inputs):
    q, k, v, valid = inputs
    mask = padding_mask(valid)
    weights = jax.random.normal(jax.random.key(3), (B, N, H, D))
    # The gradients of sum(output * weights).
    _, grads = _jgrad(name, q, k, v, weights, mask=mask)
    for g in grads:
        g = np.asarray(g)
        assert np.isfinite(g).all()
        np.testing.assert_array_equal(g[~np.asarray(valid)], 0.0)
    assert np.abs(np.asarray(grads[2])[np.asarray(valid)]).sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_example_independent_of_batch_and_other_heads(name):
    q, k, v = qkv(1, (1, N, H, D))
    alone = _jcall(name, q, k, v)
    big = [10.0 * x for x in qkv(2, (1, N, H, D))]
    together = _jout(name, *(jnp.concatenate([a, b]) for a, b in zip((q, k, v), big)))
    chex.assert_trees_all_close(together[:1], alone, atol=2e-5, rtol=2e-5)
    # Scaling head 1 leaves head 0 unchanged.
    scaled = [x.at[..., 1, :].multiply(10.0) for x in (q, k, v)]
    chex.assert_trees_all_close(
        _jcall(name, *scaled)[..., 0, :], alone[..., 0, :], atol=2e-5, rtol=2e-5
    )


@pytest.mark.parametrize("name", NAMES)
def test_query_without_valid_keys_gives_zeros_and_finite_grads(name, inputs):
    q, k, v, _ = inputs
    valid = jnp.zeros((B, N), bool).at[1].set(True)  # example 0 entirely padded
    mask = padding_mask(valid)
    out = _jout(name, q, k, v, mask=mask)
    np.testing.assert_array_equal(np.asarray(out[0]), 0.0)
    assert np.isfinite(np.asarray(out)).all()
    _, g = _jgrad(name, q, k, v, 2 * out, mask=mask)  # the gradients of sum(output²)
    assert all(np.isfinite(np.asarray(x)).all() for x in g)
    # Key padding alone (all queries valid, no valid key in example 0) also gives zeros.
    key_mask = jnp.broadcast_to(valid[:, None, None, :], (B, 1, N, N))
    if name in ("softmax", "kernelized"):
        np.testing.assert_array_equal(np.asarray(_jout(name, q, k, v, mask=key_mask)[0]), 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_jit_grad_and_outer_vmap_agree_with_eager(name):
    q, k, v = qkv(4, (B, N, H, D))
    kw = method_kwargs(name, n=N, head_dim=D)
    fn = get_attention(name)
    eager = fn(q, k, v, **kw)
    chex.assert_shape(eager, (B, N, H, D))
    jitted = _jout(name, q, k, v)
    chex.assert_trees_all_close(jitted, eager, atol=1e-5, rtol=1e-5)
    # An extra leading batch axis through vmap equals the batched call.
    vmapped = jax.jit(jax.vmap(lambda q, k, v: fn(q, k, v, **kw)))(q[None], k[None], v[None])[0]
    chex.assert_trees_all_close(vmapped, eager, atol=1e-5, rtol=1e-5)
    g = _jgrad(name, q, k, v, jnp.ones_like(v))[1][2]  # d sum(output) / d value
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_one_compile_per_shape(name):
    q, k, v = qkv(5, (B, N, H, D))
    kw = method_kwargs(name, n=N, head_dim=D)
    fn = get_attention(name)
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(q, k, v):
        return fn(q, k, v, **kw)

    for scale in (1.0, 2.0, 3.0):
        run(q * scale, k, v).block_until_ready()


@pytest.mark.parametrize("name", NAMES)
def test_two_traces_lower_to_the_same_program(name):
    # JAX's persistent compilation cache is keyed by the lowered program: a retrace (a second
    # model in one process, a notebook cell run again, a resumed job) reuses the compiled
    # program only if nothing in it depends on the process's tracing history. The padding mask
    # brings in the traced mask check (`_checks.device_check`).
    q, k, v = qkv(5, (B, N, H, D))
    mask = padding_mask(jnp.arange(N)[None, :] < jnp.array([[N], [40]]))
    kw = method_kwargs(name, n=N, head_dim=D)
    fn = get_attention(name)
    texts = [jax.jit(lambda q, k, v, m: fn(q, k, v, mask=m, **kw)).lower(q, k, v, mask).as_text()
             for _ in range(2)]
    assert texts[0] == texts[1]


@pytest.mark.parametrize("name", NAMES)
def test_bf16_in_bf16_out_close_to_float32(name):
    q, k, v = qkv(6, (1, N, H, D))
    out16 = _jcall(name, *(x.astype(jnp.bfloat16) for x in (q, k, v)))
    assert out16.dtype == jnp.bfloat16
    out32 = _jcall(name, *(x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k, v)))
    err = float(jnp.linalg.norm(out16.astype(jnp.float32) - out32) / jnp.linalg.norm(out32))
    assert err < 1e-2  # only the final rounding to bf16: everything inside is float32


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_outputs_do_not_see_the_future(name):
    q, k, v = qkv(7, (1, N, H, D))
    base = _jcall(name, q, k, v, is_causal=True)
    i = 20
    bumped = [x.at[:, i].add(5.0) for x in (q, k, v)]
    out = _jcall(name, *bumped, is_causal=True)
    chex.assert_trees_all_close(out[:, :i], base[:, :i], atol=1e-6, rtol=1e-6)
    assert float(jnp.abs(out[:, i:] - base[:, i:]).max()) > 1e-3


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_causal_rejected_by_non_causal_methods(name):
    q, k, v = qkv(8, (1, N, H, D))
    with pytest.raises(NotImplementedError, match="is_causal") as info:
        _call(name, q, k, v, is_causal=True)
    # The message lists exactly the registry's causal functions, in registry order.
    listed = str(info.value).split("Functions with a causal form: ")[1].rstrip(".").split(", ")
    assert listed == [ATTENTIONS[c].fn.__name__ for c in CAUSAL]


@pytest.mark.parametrize("name", APPROXIMATE)
def test_approximations_reject_bias_and_non_padding_masks(name):
    q, k, v = qkv(9, (1, N, H, D))
    with pytest.raises(ValueError, match="bias"):
        _call(name, q, k, v, bias=jnp.zeros((1, H, N, N)))
    # Banded: not padding, even on the causal triangle that a causal call reads.
    band = jnp.abs(jnp.arange(N)[:, None] - jnp.arange(N)[None, :]) <= 2
    with pytest.raises(ValueError, match="padding mask"):
        _call(name, q, k, v, mask=band)


@pytest.mark.parametrize("name", NAMES)
def test_accepts_flax_attention_fn_keywords(name):
    q, k, v = qkv(10, (1, N, H, D))
    flax_kw = dict(
        dropout_rng=None,
        dropout_rate=0.0,
        broadcast_dropout=True,
        deterministic=True,
        dtype=None,
        precision=None,
        module=None,
    )
    chex.assert_trees_all_close(_jcall(name, q, k, v, **flax_kw), _jcall(name, q, k, v))
    with pytest.raises(TypeError, match="num_landmark"):
        _call(name, q, k, v, num_landmark=3)


CHUNKED = tuple(
    n for n in NAMES if "head_chunk_size" in inspect.signature(get_attention(n)).parameters
)


def test_every_lifted_method_takes_head_chunk_size():
    # Exact softmax is jax.nn.dot_product_attention itself; everything else is lifted per head.
    assert set(NAMES) - set(CHUNKED) == {"softmax"}


@pytest.mark.parametrize("name", CHUNKED)
def test_head_chunks_give_the_same_outputs_and_gradients(name, inputs):
    # B * H = 4 slices: chunks of 1 (a loop of 4 rematerialised steps), 3 (a remainder of 1)
    # and 4 (all at once: plain vmap, no loop) must agree, padding included.
    q, k, v, valid = inputs
    mask = padding_mask(valid)
    weights = jax.random.normal(jax.random.key(3), (B, N, H, D))

    def run(chunk):  # the output and the gradients of sum(output * weights)
        chunks = {} if chunk is None else {"head_chunk_size": chunk}
        return _jgrad(name, q, k, v, weights, mask=mask, **chunks)

    # The default chunk at this size is all of them, the program the gradient tests compile.
    assert resolve_head_chunk_size(name, None, B * H, N) == B * H
    reference = run(None)
    for chunk in (1, 3):
        chex.assert_trees_all_close(run(chunk), reference, atol=1e-5, rtol=1e-5)


def test_default_head_chunk_size_on_cpu():
    assert jax.default_backend() == "cpu"
    # About 4096 tokens per step on CPU, at least one slice, and plain vmap when the loop
    # would have two steps or fewer.
    assert resolve_head_chunk_size("f", None, 4, 8192) == 1
    assert resolve_head_chunk_size("f", None, 64, 256) == 16
    assert resolve_head_chunk_size("f", None, 64, 128) == 64
    assert resolve_head_chunk_size("f", None, 4, 48) == 4
    assert resolve_head_chunk_size("f", 3, 4, 8192) == 3
    assert resolve_head_chunk_size("f", 99, 4, 8192) == 4


@pytest.mark.parametrize("name", NAMES)
def test_seq_lengths_are_an_o_n_padding_mask(name, inputs):
    # jax.nn.dot_product_attention's query_seq_lengths / key_value_seq_lengths mean right
    # padding; they must give exactly what the equivalent (B, 1, N, N) padding mask gives,
    # eagerly and with the lengths traced under jit.
    q, k, v, valid = inputs
    lengths = valid.sum(-1).astype(jnp.int32)  # [30, 48]
    by_mask = _jout(name, q, k, v, mask=padding_mask(valid))
    by_lengths = _call(name, q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    chex.assert_trees_all_close(by_lengths, by_mask, atol=1e-6, rtol=1e-6)
    jitted = _jcall(name, q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    chex.assert_trees_all_close(jitted, by_mask, atol=1e-5, rtol=1e-5)
    # Concrete lengths captured by a jitted function are still checked, and still work.
    captured = jax.jit(
        lambda: _call(name, q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    )()
    chex.assert_trees_all_close(captured, by_mask, atol=1e-5, rtol=1e-5)
    too_long = lengths + 19  # [49, 67] > N = 48
    with pytest.raises(ValueError, match=r"key_value_seq_lengths.*\[0, 48\].*49 to 67"):
        jax.jit(lambda: _call(name, q, k, v, key_value_seq_lengths=too_long))()
    # Lengths and a mask combine by `and`: keys by length, queries by mask.
    query_mask = valid[:, None, :, None] & jnp.ones((1, 1, 1, N), bool)
    both = _jcall(name, q, k, v, mask=query_mask, key_value_seq_lengths=lengths)
    chex.assert_trees_all_close(both, by_mask, atol=1e-6, rtol=1e-6)
    if name == "spectral_shift":
        chex.assert_trees_all_close(
            spectral_shift_delta(
                q, k, num_landmarks=8, query_seq_lengths=lengths, key_value_seq_lengths=lengths
            ),
            spectral_shift_delta(q, k, padding_mask(valid), num_landmarks=8),
            atol=1e-6,
        )


@pytest.mark.parametrize("name", NAMES)
def test_key_padding_mask_alone_keeps_padded_queries_out_of_valid_outputs(name, inputs):
    # A BERT-style (B, 1, 1, n) mask says nothing about queries: in self-attention the
    # landmark methods must still keep padded queries' content out of the valid outputs.
    q, k, v, valid = inputs
    key_mask = valid[:, None, None, :]
    noisy_q = jnp.where(valid[:, :, None, None], q, 100.0)
    sel = np.asarray(valid)
    clean = np.asarray(_jcall(name, q, k, v, mask=key_mask))[sel]
    noisy = np.asarray(_jcall(name, noisy_q, k, v, mask=key_mask))[sel]
    chex.assert_trees_all_close(clean, noisy, atol=1e-5, rtol=1e-5)


def test_equal_length_cross_attention_with_a_key_mask_keeps_every_query():
    # Key padding must not be read as query padding: every query still gets its output.
    q, k, v, valid = qkv(11, (B, N, H, D)) + (jnp.arange(N)[None, :] < jnp.array([[30], [N]]),)
    out = np.asarray(_jcall("nystrom", q, k, v, mask=valid[:, None, None, :]))
    assert (np.abs(out[0, 30:]).sum(-1) > 0).all()


def test_softmax_dropout_follows_flax_semantics():
    q, k, v = qkv(12, (2, 16, 2, 8))
    rng = jax.random.key(3)
    from spectral_jax.attention import reference_attention, softmax_attention

    out = softmax_attention(
        q, k, v, dropout_rate=0.5, dropout_rng=rng, deterministic=False, broadcast_dropout=False
    )
    # By hand: the same keep mask Flax draws, applied to the exact weights, rescaled by 1/0.5.
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    keep = jax.random.bernoulli(rng, 0.5, logits.shape)
    weights = jax.nn.softmax(logits, axis=-1) * keep / 0.5
    expected = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    chex.assert_trees_all_close(out, expected, atol=1e-5)
    # Evaluation mode and a zero rate are the plain exact attention; dropout needs a key.
    chex.assert_trees_all_close(
        softmax_attention(q, k, v, dropout_rate=0.5, deterministic=True),
        reference_attention(q, k, v),
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="needs `dropout_rng`"):
        softmax_attention(q, k, v, dropout_rate=0.5, deterministic=False)
