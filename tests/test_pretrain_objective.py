"""Self-pretraining's objectives by value (the denoising loss counts masked valid tokens only;
next-token pairs of valid positions) and its config checks, which fail before anything runs."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UsageError
from spectral_jax.lra.train import pretrain, pretrain_stage
from spectral_jax.lra.train.config_lib import validate_config
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.nn import TransformerConfig


def _logits_and_targets(seed: int = 0, shape=(3, 10), vocab: int = 7):
    k1, k2 = jax.random.split(jax.random.key(seed))
    logits = jax.random.normal(k1, (*shape, vocab)) * 2.0
    targets = jax.random.randint(k2, shape, 1, vocab)
    return logits, targets


def _reference_loss(logits, targets, selected) -> float:
    """Mean float64 cross-entropy over the selected positions."""
    z = np.asarray(logits, np.float64)
    log_p = z - z.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, np.asarray(targets)[..., None], -1)[..., 0]
    sel = np.asarray(selected)
    return float(-(picked * sel).sum() / sel.sum())


def test_token_loss_counts_selected_positions_only():
    logits, targets = _logits_and_targets()
    lengths = np.array([10, 6, 3])
    valid = np.arange(10)[None] < lengths[:, None]
    masked = np.asarray(jax.random.bernoulli(jax.random.key(1), 0.5, (3, 10)))
    selected = jnp.asarray(valid & masked)
    loss, sums = pretrain.token_loss(logits, targets, selected)
    np.testing.assert_allclose(float(loss), _reference_loss(logits, targets, selected), rtol=1e-6)
    assert float(sums["count"]) == selected.sum()
    # Anything at padding or at kept (unmasked) tokens, logits or targets, changes nothing.
    other = ~np.asarray(selected)
    noisy = jnp.where(other[..., None], 100.0 * jax.random.normal(jax.random.key(2),
                                                                   logits.shape), logits)
    moved = jnp.where(other, (targets + 3) % 7, targets)
    again, again_sums = pretrain.token_loss(noisy, moved, selected)
    assert float(again) == float(loss)
    assert float(again_sums["correct"]) == float(sums["correct"])
    # Nothing selected: loss 0, not NaN.
    empty, _ = pretrain.token_loss(logits, targets, jnp.zeros((3, 10), bool))
    assert float(empty) == 0.0


def test_corrupt_masks_valid_tokens_only_at_the_rate():
    inputs = jnp.tile(jnp.arange(1, 201)[None] % 16 + 1, (50, 1))
    valid = jnp.arange(200)[None] < jnp.arange(50, 250, 4)[:, None]  # some rows padded
    inputs = jnp.where(valid, inputs, 0)
    corrupted, selected = pretrain.corrupt(inputs, valid, jax.random.key(0), 0.5, 99)
    sel = np.asarray(selected)
    assert not (sel & ~np.asarray(valid)).any()
    np.testing.assert_array_equal(np.asarray(corrupted)[sel], 99)
    np.testing.assert_array_equal(np.asarray(corrupted)[~sel], np.asarray(inputs)[~sel])
    assert abs(sel.sum() / np.asarray(valid).sum() - 0.5) < 0.02


def _model(**kw):
    cfg = TransformerConfig(vocab_size=9, num_classes=2, max_length=12, num_layers=1,
                            embed_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                            dropout_rate=0.0, **kw)
    return pretrain.PretrainModel(cfg, rngs=nnx.Rngs(0))


def _batch(tokens, valid):
    return {"inputs": jnp.asarray(tokens), "mask": jnp.asarray(valid),
            "weight": jnp.ones(len(tokens))}


def test_denoising_metrics_ignore_padding_and_match_the_loss_of_the_corrupted_input():
    model = _model()
    tokens = np.array([[3, 4, 5, 6, 7, 2, 3, 4, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4,
                                                             5]])
    valid = tokens > 0
    key = jax.random.key(3)
    loss, sums = pretrain.stage_metrics(model, _batch(tokens, valid), key, deterministic=True,
                                        kind="denoise", rate=0.5, mask_id=8)
    corrupted, selected = pretrain.corrupt(jnp.asarray(tokens), jnp.asarray(valid), key, 0.5, 8)
    logits = model(corrupted, jnp.asarray(valid), deterministic=True)
    np.testing.assert_allclose(float(loss), _reference_loss(logits, tokens, selected), rtol=1e-5)
    # Other ids at the padded positions: the same loss, bit for bit.
    padded = np.where(valid, tokens, 5)
    again, _ = pretrain.stage_metrics(model, _batch(padded, valid), key, deterministic=True,
                                      kind="denoise", rate=0.5, mask_id=8)
    assert float(again) == float(loss) and float(sums["count"]) == selected.sum()


def test_next_token_metrics_predict_the_following_valid_token():
    model = _model(is_causal=True)
    tokens = np.array([[3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0]])
    valid = tokens > 0
    loss, sums = pretrain.stage_metrics(model, _batch(tokens, valid), jax.random.key(0),
                                        deterministic=True, kind="next_token", rate=0.5,
                                        mask_id=8)
    logits = model(jnp.asarray(tokens), jnp.asarray(valid), deterministic=True)
    want = _reference_loss(logits[:, :4], tokens[:, 1:5], np.ones((1, 4), bool))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert float(sums["count"]) == 4  # 5 valid tokens: 4 (t, t + 1) pairs


SPEC = "lra/listops:quick"


@pytest.mark.parametrize("arg, override, names", [
    ("attention=nystrom", "train.pretrain_objective=next_token",
     ("pretrain_objective='next_token'", "attention='nystrom'", "no causal form")),
    ("attention=gated_linear", "train.pretrain_objective=denoise",
     ("pretrain_objective='denoise'", "attention='gated_linear'", "causal only")),
    ("attention=softmax", "train.pretrain_objective=next_token",
     ("pretrain_objective='next_token'", "attention='softmax'", "model.is_causal=True")),
])
def test_an_objective_the_method_cannot_serve_fails_before_any_work(tmp_path, arg, override,
                                                                    names):
    from spectral_jax.lra.train.loop import train_and_evaluate

    config = load_config(f"{SPEC},{arg}", ["train.pretrain_steps=10", override,
                                           f"data.dir={tmp_path / 'data'}"])
    with pytest.raises(UsageError) as err:
        train_and_evaluate(config, str(tmp_path / "run"))
    for name in names:
        assert name in str(err.value)
    # Refused before data generation, compiling or claiming the workdir.
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_spt_argument_and_defaults():
    plain = load_config(SPEC, [])
    assert (plain.train.pretrain_steps, plain.train.pretrain_objective,
            plain.train.pretrain_mask_rate) == (0, "auto", 0.5)
    assert not pretrain.enabled(plain)
    spt = load_config(f"{SPEC},spt", [])
    assert spt.train.pretrain_steps == spt.train.steps == 3500 and pretrain.enabled(spt)
    assert pretrain.objective(spt) == "denoise"
    causal = load_config(f"{SPEC},spt,attention=gated_linear", [])
    assert pretrain.objective(causal) == "next_token"
    with pytest.raises(UsageError, match="pretrain_mask_rate"):
        validate_config(load_config(SPEC, ["train.pretrain_mask_rate=1.5"]))
    with pytest.raises(UsageError, match="pretrain_objective"):
        validate_config(load_config(SPEC, ["train.pretrain_objective=mlm"]))


def test_the_stage_summary_records_a_mask_rate_for_denoising_only(tmp_path):
    meta = {"val_loss": 2.0, "val_accuracy": 0.25, "best_val_accuracy": 0.25,
            "wall_time_s": 1.0}
    for spec, objective, rate in ((f"{SPEC},spt", "denoise", 0.5),
                                  (f"{SPEC},spt,attention=gated_linear", "next_token", None)):
        pretrain_stage._write_summary(str(tmp_path), load_config(spec, []), meta)
        summary = json.loads((tmp_path / pretrain.SUMMARY_FILE).read_text())
        assert (summary["objective"], summary["mask_rate"]) == (objective, rate)
