"""The sequence-sharded form equals the single-device call, and its traffic does not grow.

Runs on the 8 simulated CPU devices of conftest. Each example of the batch exercises one
padding case: right padding whose boundary falls inside a shard (so segments cross shard
boundaries), and an example whose valid tokens all sit on the first shard.
"""

import functools
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import method_kwargs

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention import ATTENTIONS, SHARD_FORMS
from spectral_jax.attention.sparse._probsparse import log_budget
from spectral_jax.lra.bench.parallel import compile_call
from spectral_jax.lra.compiled import collectives
from spectral_jax.parallel import sequence_parallel

LENGTH = 64
# Example 0: 37 valid tokens (a boundary inside a shard at 2, 4 and 8 devices); example 1:
# 5 valid tokens, all on the first shard even at 8 devices (8 tokens per shard).
LENGTHS = jnp.array([37, 5])
SHARDED = tuple(n for n, s in ATTENTIONS.items() if s.sequence_parallel is not None)
# Every sharded method, and its causal form where it has one.
CASES = [(n, False) for n in SHARDED if not ATTENTIONS[n].causal_only] + [
    (n, True) for n in SHARDED if ATTENTIONS[n].supports_causal]


def _mesh(devices: int, axis: str = "seq") -> jax.sharding.Mesh:
    return jax.make_mesh((devices,), (axis,), devices=jax.devices()[:devices])


def _inputs():
    return jax.random.normal(jax.random.key(0), (3, 2, LENGTH, 2, 8))


def _kwargs(name, **extra):
    return {**method_kwargs(name, n=LENGTH, head_dim=8), **extra}


def _loss_and_out(fn, **kwargs):
    def loss(q, k, v):
        out = fn(q, k, v, query_seq_lengths=LENGTHS, key_value_seq_lengths=LENGTHS, **kwargs)
        cotangent = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
        return (out * cotangent).sum(), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _jit_mask_call(fn, **kwargs):
    """``fn(q, k, v, mask=mask, **kwargs, **arrays)`` jitted, the mask and the array keywords
    traced: one program per call (an eager call compiles every operation on its own)."""
    return jax.jit(lambda q, k, v, mask, **arrays: fn(q, k, v, mask=mask, **kwargs, **arrays))


@functools.cache
def _single_device(name, is_causal, extra=()):
    """The single-device outputs and gradients, computed once for every device count."""
    kwargs = _kwargs(name, **dict(extra))
    fn = _loss_and_out(functools.partial(ATTENTIONS[name].fn, **kwargs), is_causal=is_causal)
    return fn(*_inputs())


def _check_sharded(name, is_causal, devices, extra=()):
    (_, want), want_grads = _single_device(name, is_causal, extra)
    sharded = sequence_parallel(name, mesh=_mesh(devices), **_kwargs(name, **dict(extra)))
    (_, got), got_grads = _loss_and_out(sharded, is_causal=is_causal)(*_inputs())
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)
    # Padded queries stay zero on every shard.
    assert float(np.abs(np.asarray(got)[1, 5:]).max()) == 0.0


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize(("name", "is_causal"), CASES)
def test_sharded_equals_single_device_outputs_and_gradients(name, is_causal, devices):
    _check_sharded(name, is_causal, devices)


@pytest.mark.parametrize("extra", [
    (("shift", "split"),), (("shift", "exact"),), (("shift", "zero"),)], ids=str)
def test_spectral_shift_forms_shard(extra):
    _check_sharded("spectral_shift", False, 4, extra)


def test_skyformer_evenly_spaced_landmarks_shard():
    _check_sharded("skyformer", False, 4, (("rng", None),))


@pytest.mark.parametrize("name", SHARDED)
def test_batch_axis_mask_with_holes_and_lengths_equal_single_device(name):
    # One program checks three things at once: the batch split over "data" beside the
    # sequence over "seq", a padding mask with holes in every shard (broadcast over the
    # batch), and lengths split with the batch, combined with that mask by `and`.
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    m = jnp.arange(LENGTH) % 3 != 0
    mask = (m[:, None] & m[None, :])[None, None]
    q, k, v = _inputs()
    lengths = {"query_seq_lengths": LENGTHS, "key_value_seq_lengths": LENGTHS}
    want = _jit_mask_call(ATTENTIONS[name].fn, **_kwargs(name))(q, k, v, mask, **lengths)
    fn = sequence_parallel(name, mesh=mesh, batch_axis="data", **_kwargs(name))
    got = _jit_mask_call(fn)(q, k, v, mask, **lengths)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    # Example 1 has 5 valid tokens: its padded queries stay zero on every shard.
    assert float(np.abs(np.asarray(got)[1, 5:]).max()) == 0.0


def test_luna_carries_its_packed_sequence_split_over_the_batch():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    q, k, v = _inputs()
    packed = jax.random.normal(jax.random.key(3), (2, 8, 2, 8))  # one P' per example
    kwargs = {"packed_query": packed, "return_packed": True}
    want = ATTENTIONS["luna"].fn(q, k, v, query_seq_lengths=LENGTHS,
                                 key_value_seq_lengths=LENGTHS, **kwargs)
    fn = sequence_parallel("luna", mesh=mesh, batch_axis="data", **kwargs)
    got = jax.jit(fn)(q, k, v, query_seq_lengths=LENGTHS, key_value_seq_lengths=LENGTHS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5)


def test_registry_names_a_known_form_and_a_formula_or_the_call_refuses():
    assert "nystrom" in SHARDED
    for name, spec in ATTENTIONS.items():
        if spec.sequence_parallel is None:
            assert spec.communication is None, name
            with pytest.raises(UnsupportedError, match=f"{name!r} has no sequence-sharded"):
                sequence_parallel(name, mesh=_mesh(2))
        else:
            assert spec.sequence_parallel in SHARD_FORMS, name
            assert spec.communication, name


def _forward_collectives(fn, length: int, head_dim: int, v_head_dim: int):
    """The collectives of the compiled forward call, one example and head, traced lengths."""
    x = jax.ShapeDtypeStruct((1, length, 1, head_dim), jnp.float32)
    v = jax.ShapeDtypeStruct((1, length, 1, v_head_dim), jnp.float32)
    lens = jax.ShapeDtypeStruct((1,), jnp.int32)

    def call(q, k, v, q_len, kv_len):
        return fn(q, k, v, query_seq_lengths=q_len, key_value_seq_lengths=kv_len)

    return collectives(jax.jit(call).lower(x, x, v, lens, lens).compile())


_FUNCTIONS = {"min": min, "ceil": math.ceil}


def _evaluate(formula: str, **symbols: int) -> int:
    """A registry formula such as ``2m(d + d_v + 2) + 3P·min(k, n/P)`` at the given symbol
    values."""
    tokens = re.findall(r"\d+|[A-Za-z_]\w*|[()+\-·/,]", formula.replace(" ", ""))
    python = []
    for prev, tok in zip([None] + tokens, tokens):
        # Juxtaposition is a product: 2m, 2(, m(, )(, )m; a function name calls.
        if (prev and prev not in _FUNCTIONS and (prev[-1].isalnum() or prev == ")")
                and (tok[0].isalnum() or tok == "(")):
            python.append("*")
        python.append({"·": "*"}.get(tok, str(symbols[tok]) if tok in symbols else tok))
    # The registry's own formula: digits, symbols, + - * / ( ) and the functions.
    return eval("".join(python), dict(_FUNCTIONS))


def _symbols(budget: int, n: int) -> dict[str, int]:
    """The formulas' symbols other than P, d, d_v and s: every budget (k the projected
    length or top keys) at ``budget``, t Lloyd steps, u = Informer's budget·⌈ln n⌉ (what
    the formula test compiles)."""
    return {"m": budget, "r": budget, "l": budget, "w": budget, "k": budget, "c": budget,
            "t": 3, "u": log_budget(budget, n), "n": n}


def _grows_with_length(communication: str) -> bool:
    """Whether a registry formula's default form (its first part) grows with n (ring passes,
    ProbSparse's key sample)."""
    formula, size = communication.split("; ")[0], {"d": 8, "d_v": 8, "P": 4, "s": 8}
    return _evaluate(formula, **size, **_symbols(8, 256)) != _evaluate(
        formula, **size, **_symbols(8, 1024))


@pytest.mark.parametrize("name", [n for n in SHARDED
                                  if not _grows_with_length(ATTENTIONS[n].communication)])
def test_collectives_do_not_grow_with_the_length(name):
    # Forward and the gradients of query, key and value, as a training step runs them.
    short, long = (collectives(compile_call(name, n, 4, head_dim=8, budget=8))
                   for n in (256, 1024))
    assert short, "the sharded program has no collective"
    assert sum(c.nbytes for c in short) == sum(c.nbytes for c in long)
    # No collective carries an array as long as the sequence (or a shard of it).
    for c in long:
        assert not {1024, 1024 // 4} & set(c.shape), c


@pytest.mark.parametrize(("name", "is_causal"), CASES)
def test_communication_formula_matches_the_compiled_program(name, is_causal):
    spec = ATTENTIONS[name]
    budget, d, devices, s = 16, 8, 4, 12
    # A summary read back as keys, or memory slots from one convolution of the head dim,
    # has the keys' width.
    d_v = 4 if spec.linear_in_value and spec.state != "memory_conv" else d
    kwargs = method_kwargs(name, n=256, head_dim=d, budget=budget)
    if name == "spectral_shift":
        kwargs["num_delta_rows"] = s
    symbols = _symbols(budget, 256)
    for arg, symbol in (("topk", "k"), ("iterations", "t")):
        if arg in inspect.signature(spec.fn).parameters:
            kwargs[arg] = symbols[symbol]
    forms = dict(part.split(": ") if ": " in part else ("", part)
                 for part in spec.communication.split("; "))
    formula = forms.get("causal", forms[""]) if is_causal else forms[""]
    # A "rng=None: ..." part is the deterministic form's (an evenly spaced sample).
    checks = [(formula, kwargs)] + ([(forms["rng=None"], {**kwargs, "rng": None})]
                                    if "rng=None" in forms and not is_causal else [])
    for formula, call_kwargs in checks:
        fn = sequence_parallel(name, mesh=_mesh(devices), is_causal=is_causal, **call_kwargs)
        want = _evaluate(formula, d=d, d_v=d_v, P=devices, s=s, **symbols)
        assert sum(c.size for c in _forward_collectives(fn, 256, d, d_v)) == want, formula


def test_bad_input_names_the_problem():
    mesh = _mesh(4)
    q, x = jnp.ones((2, 30, 2, 8)), jnp.ones((2, 32, 2, 8))
    with pytest.raises(UsageError, match=r"30 is not divisible by the 4 devices"):
        sequence_parallel("nystrom", mesh=mesh)(q, q, q)
    with pytest.raises(UsageError, match=r"its axes are \('seq',\)"):
        sequence_parallel("nystrom", mesh=mesh, axis_name="sequence")
    with pytest.raises(UsageError, match="Unknown attention 'nystromer'"):
        sequence_parallel("nystromer", mesh=mesh)
    with pytest.raises(UsageTypeError, match="must be a jax.sharding.Mesh"):
        sequence_parallel("nystrom", mesh=jax.devices())
    with pytest.raises(UsageError, match="`bias` cannot be split"):
        sequence_parallel("nystrom", mesh=mesh)(x, x, x, bias=jnp.zeros((32, 32)))
    with pytest.raises(UnsupportedError, match="is_causal=True"):
        jax.jit(sequence_parallel("nystrom", mesh=mesh, is_causal=True))(x, x, x)
    with pytest.raises(UsageError, match="q_len=16, kv_len=32"):
        sequence_parallel("linear", mesh=mesh, is_causal=True)(x[:, :16], x, x)
    with pytest.raises(UsageError, match=r"multiple of the window \(at least the window\)"):
        jax.jit(sequence_parallel("local", mesh=mesh, window=24))(x, x, x)  # 8-token shards
    with pytest.raises(UsageTypeError, match="is_causal"):
        jax.jit(sequence_parallel("softmax", mesh=mesh))(x, x, x, is_causal=True)
    with pytest.raises(UnsupportedError, match="pinv_init='global'"):
        sequence_parallel("nystrom", mesh=jax.make_mesh((2, 4), ("data", "seq")),
                          batch_axis="data", pinv_init="global")(x, x, x)
