"""The sequence-sharded form equals the single-device call, and its traffic does not grow.

Runs on the 8 simulated CPU devices of conftest. Each example of the batch exercises one
padding case: right padding whose boundary falls inside a shard (so segments cross shard
boundaries), and an example whose valid tokens all sit on the first shard.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention import ATTENTIONS, SHARD_FORMS
from spectral_jax.parallel import sequence_parallel

LENGTH = 64
# Example 0: 37 valid tokens (a boundary inside a shard at 2, 4 and 8 devices); example 1:
# 5 valid tokens, all on the first shard even at 8 devices (8 tokens per shard).
LENGTHS = jnp.array([37, 5])
SHARDED = tuple(n for n, s in ATTENTIONS.items() if s.sequence_parallel is not None)


def _mesh(devices: int, axis: str = "seq") -> jax.sharding.Mesh:
    return jax.make_mesh((devices,), (axis,), devices=jax.devices()[:devices])


def _inputs():
    return jax.random.normal(jax.random.key(0), (3, 2, LENGTH, 2, 8))


def _loss_and_out(fn):
    def loss(q, k, v):
        out = fn(q, k, v, query_seq_lengths=LENGTHS, key_value_seq_lengths=LENGTHS)
        cotangent = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
        return (out * cotangent).sum(), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("name", SHARDED)
def test_sharded_equals_single_device_outputs_and_gradients(name, devices):
    spec = ATTENTIONS[name]
    kwargs = {spec.budget: spec.test_budget} if spec.budget else {}
    q, k, v = _inputs()
    (_, want), want_grads = _loss_and_out(lambda *a, **kw: spec.fn(*a, **kw, **kwargs))(q, k, v)
    sharded = sequence_parallel(name, mesh=_mesh(devices), **kwargs)
    (_, got), got_grads = _loss_and_out(sharded)(q, k, v)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)
    # Padded queries stay zero on every shard.
    assert float(np.abs(np.asarray(got)[1, 5:]).max()) == 0.0


def test_padding_mask_with_holes_equals_single_device():
    m = jnp.arange(LENGTH) % 3 != 0  # holes in every shard
    mask = (m[:, None] & m[None, :])[None, None]
    q, k, v = _inputs()
    want = ATTENTIONS["nystrom"].fn(q, k, v, mask=mask, num_landmarks=8)
    got = jax.jit(sequence_parallel("nystrom", mesh=_mesh(4), num_landmarks=8))(
        q, k, v, mask=mask)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_batch_axis_splits_the_batch_beside_the_sequence():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    q, k, v = _inputs()
    want = ATTENTIONS["nystrom"].fn(q, k, v, num_landmarks=8, query_seq_lengths=LENGTHS,
                                    key_value_seq_lengths=LENGTHS)
    fn = sequence_parallel("nystrom", mesh=mesh, batch_axis="data", num_landmarks=8)
    got = jax.jit(fn)(q, k, v, query_seq_lengths=LENGTHS, key_value_seq_lengths=LENGTHS)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


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


_COLLECTIVE = re.compile(
    r"=\s*(\S+)\s+(all-reduce|all-gather|collective-permute|all-to-all)(?:-start)?\(")


def _collectives(fn, length: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every collective of the compiled program: (kind, result shape)."""
    x = jax.ShapeDtypeStruct((2, length, 2, 8), jnp.float32)
    text = jax.jit(fn).lower(x, x, x).compile().as_text()
    found = []
    for shape_text, kind in _COLLECTIVE.findall(text):
        for dims in re.findall(r"\w+\[([\d,]*)\]", shape_text):
            found.append((kind, tuple(int(d) for d in dims.split(",") if d)))
    return found


def test_nystrom_collectives_do_not_grow_with_the_length():
    fn = sequence_parallel("nystrom", mesh=_mesh(4), num_landmarks=8)
    short, long = _collectives(fn, 256), _collectives(fn, 1024)
    assert short, "the sharded program has no collective"

    def size(found):
        return sum(int(np.prod(shape)) for _, shape in found)

    assert size(short) == size(long)
    # No collective carries an array as long as the sequence (or a shard of it).
    for _, shape in long:
        assert not {1024, 1024 // 4} & set(shape), shape


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
