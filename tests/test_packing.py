"""Packing: first fit checked against an independent simulation, segment ids and positions;
a packed CausalLM row gives each document the logits it gets alone."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from layer_cases import apply_jitted

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.lra.data.packing import lay_out, pack
from spectral_jax.nn import CausalLM, TransformerConfig


def _sequences(seed: int, count: int, length: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 40, rng.integers(1, length + 1)).astype(np.int32)
            for _ in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_every_sequence_sits_once_where_first_fit_puts_it(seed):
    length = 16
    seqs = _sequences(seed, 40, length)
    p = pack(seqs, length)
    # First fit, simulated independently: the earliest row with room, else a new one.
    used: list[int] = []
    for seq, (row, start) in zip(seqs, p.placement):
        fits = [r for r, u in enumerate(used) if u + len(seq) <= length]
        expected = fits[0] if fits else len(used)
        if expected == len(used):
            used.append(0)
        assert (row, start) == (expected, used[expected])
        used[expected] += len(seq)
        np.testing.assert_array_equal(p.tokens[row, start:start + len(seq)], seq)
        np.testing.assert_array_equal(p.positions[row, start:start + len(seq)],
                                      np.arange(len(seq)))
        assert len(set(p.segment_ids[row, start:start + len(seq)].tolist())) == 1
    assert p.tokens.shape == (len(used), length)
    assert int((p.segment_ids > 0).sum()) == sum(map(len, seqs))
    assert p.padding_fraction == pytest.approx(1 - sum(map(len, seqs)) / p.tokens.size)
    # In a row, ids count 1, 2, ... in order and padding is 0 (tokens and positions too).
    for row in range(len(used)):
        ids = p.segment_ids[row][p.segment_ids[row] > 0]
        assert ids.tolist() == sorted(ids.tolist()) and ids[0] == 1
        assert (np.diff(np.unique(ids)) == 1).all()
    pad = p.segment_ids == 0
    assert (p.tokens[pad] == 0).all() and (p.positions[pad] == 0).all()
    # Packing is denser than one sequence per row.
    assert len(used) < len(seqs)


def test_pack_names_what_it_refuses():
    with pytest.raises(UsageError, match=r"`sequences\[1\]` must be a 1-D int array of 1 to "
                                         r"length=4 int32 tokens; got int64 of shape \(5,\)"):
        pack([np.array([1]), np.arange(5)], 4)
    with pytest.raises(UsageError, match=r"`sequences\[0\]`.*float"):
        pack([np.ones(2)], 4)
    with pytest.raises(UsageError, match="length"):
        pack([np.array([1])], 0)
    with pytest.raises(UsageError, match=r"`sequences\[0\]`.*int32 tokens"):
        pack([np.array([2**40])], 4)
    assert pack([], 4).padding_fraction == 0.0
    p = pack([np.array([1, 2]), np.array([3])], 4)
    with pytest.raises(UsageError, match=r"`sequences\[0\]` has 3 tokens"):
        lay_out([np.array([1, 2, 3]), np.array([4])], p, fill=0)
    with pytest.raises(UsageError, match=r"1 sequences for 2 packed ones"):
        lay_out([np.array([1, 2])], p, fill=0)
    with pytest.raises(UsageError, match=r"`sequences\[1\]` must be a 1-D int array; got float"):
        lay_out([np.array([1, 2]), np.array([0.5])], p, fill=0)


@pytest.mark.parametrize("attention,positional", [
    ("softmax", "sinusoidal"), ("softmax", "rope"), ("linear", "learned"), ("gla", "rope"),
    ("local", "sinusoidal")])
def test_a_packed_row_gives_each_document_its_own_logits(attention, positional):
    config = TransformerConfig(vocab_size=40, num_classes=40, max_length=24, num_layers=2,
                               embed_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                               is_causal=True, attention=attention, positional=positional,
                               dropout_rate=0.0)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    run = apply_jitted
    docs = _sequences(7, 4, 10)
    p = pack(docs, 24)
    logits = np.asarray(run(model, jnp.asarray(p.tokens), segment_ids=jnp.asarray(p.segment_ids),
                            positions=jnp.asarray(p.positions)))
    # Without positions they are derived from the segment ids: the same logits (padding,
    # one run of id 0, counts its own positions there).
    derived = run(model, jnp.asarray(p.tokens), segment_ids=jnp.asarray(p.segment_ids))
    real = p.segment_ids > 0
    np.testing.assert_allclose(np.asarray(derived)[real], logits[real], rtol=0, atol=1e-6)
    # Each document alone, one per row, right-padded: a causal model's logits at a token
    # do not depend on the tokens after it.
    alone = np.asarray(run(model, jnp.asarray(np.stack(
        [np.pad(doc, (0, 10 - len(doc)), constant_values=1) for doc in docs]))))
    for i, (doc, (row, start)) in enumerate(zip(docs, p.placement)):
        want = alone[i, :len(doc)]
        np.testing.assert_allclose(logits[row, start:start + len(doc)], want, rtol=0,
                                   atol=2e-5 * float(np.abs(want).max()))


def test_a_model_whose_method_mixes_documents_refuses_them():
    config = TransformerConfig(vocab_size=40, num_classes=40, max_length=16, num_layers=1,
                               embed_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                               is_causal=True, attention="gated_linear", dropout_rate=0.0)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    p = pack(_sequences(1, 3, 5), 16)
    with pytest.raises(UnsupportedError, match="Functions that take segment ids: "):
        model(jnp.asarray(p.tokens), segment_ids=jnp.asarray(p.segment_ids),
              positions=jnp.asarray(p.positions))


def test_positions_are_checked_against_the_embedding():
    config = TransformerConfig(vocab_size=40, num_classes=40, max_length=8, num_layers=1,
                               embed_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                               is_causal=True, positional="learned", dropout_rate=0.0)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(UsageError, match=r"positions must lie in \[0, max_length=8\); got 0..20"):
        model(tokens, positions=jnp.array([[0, 1, 2, 20]]))
    with pytest.raises(UsageError, match=r"positions must be int"):
        model(tokens, positions=jnp.zeros((1, 4)))


def test_a_rotary_layer_restarts_positions_at_each_segment():
    from spectral_jax.nn import MultiHeadAttention
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 7, 16)), jnp.float32)
    ids = jnp.array([[1, 1, 1, 2, 2, 2, 2]])
    layer = MultiHeadAttention(2, 16, attention="linear", is_causal=True, rope=True,
                               rngs=nnx.Rngs(0))
    packed = layer(x, segment_ids=ids, deterministic=True)
    for part in (slice(0, 3), slice(3, 7)):
        np.testing.assert_allclose(packed[:, part], layer(x[:, part], deterministic=True),
                                   rtol=0, atol=1e-5)
