"""The LRA config files: every task x protocol x method builds and validates, and the numbers
match the reference protocols (LRA's released configs; Nystromformer/Skyformer's small model)."""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spectral_jax.attention import available_attentions
from spectral_jax.lra.train import config_lib
from spectral_jax.lra.train import steps as optim
from spectral_jax.lra.cli.train import load_config

ROOT = Path(__file__).resolve().parents[1]


def config(task: str, arg: str = "") -> ml_collections.ConfigDict:
    return load_config(f"{ROOT}/configs/lra/{task}.py" + (f":{arg}" if arg else ""))


@pytest.mark.parametrize("task", config_lib.TASKS)
@pytest.mark.parametrize("protocol", config_lib.PROTOCOLS)
def test_every_task_protocol_and_method_validates(task, protocol):
    for attention in available_attentions():
        cfg = config(task, f"attention={attention},protocol={protocol}")
        config_lib.validate_config(cfg)
        assert (cfg.task, cfg.protocol, cfg.seed) == (task, protocol, 0)
        assert cfg.model.attention == attention
        # Everything that defines a result is recorded.
        for key in ("vocab_size", "max_length", "pooling", "positional", "attention_kwargs"):
            assert cfg.model[key] is not None, (task, protocol, key)
        if attention != "softmax":
            assert cfg.model.attention_dropout_rate == 0.0
        optim.make_optimizer(cfg)


def test_default_attention_and_quick_forms():
    assert config("listops").model.attention == "spectral_shift"
    assert config("listops", "quick").to_dict() == config("listops", "protocol=quick").to_dict()
    quick = config("listops", "quick")
    assert quick.data.generate.max_length == quick.model.max_length == 128
    assert quick.model.attention_kwargs.num_landmarks == 16
    assert config("listops", "quick,seed=3").seed == 3


def test_lra_protocol_numbers():
    listops = config("listops", "attention=softmax")
    m, t = listops.model, listops.train
    assert (m.max_length, m.num_layers, m.embed_dim, m.num_heads, m.qkv_dim, m.mlp_dim) == (
        2000, 4, 512, 8, 512, 1024)
    assert (m.pooling, m.positional, m.attention_dropout_rate) == ("cls", "sinusoidal", 0.1)
    assert (t.steps, t.batch_size, t.optimizer.learning_rate, t.optimizer.b2, t.optimizer.eps,
            t.optimizer.weight_decay) == (5000, 32, 0.05, 0.98, 1e-9, 0.1)
    assert (t.schedule.name, t.schedule.warmup_steps) == ("rsqrt", 1000)
    image = config("image")
    assert (image.train.schedule.name, image.train.batch_size, image.model.pooling) == (
        "cosine", 256, "cls")
    pathx = config("pathx")
    assert (pathx.model.max_length, pathx.train.grad_clip_norm, pathx.train.steps) == (
        16384, 1.0, 500000)
    retrieval = config("retrieval")
    assert (retrieval.model.interaction, retrieval.train.schedule.warmup_steps) == ("concat", 8000)


@pytest.mark.parametrize("task", config_lib.TASKS)
def test_small_protocol_is_the_nystromformer_model(task):
    cfg = config(task, "protocol=small,attention=nystrom")
    m = cfg.model
    assert (m.num_layers, m.embed_dim, m.num_heads, m.qkv_dim // m.num_heads, m.mlp_dim) == (
        2, 64, 2, 32, 128)
    assert (m.pooling, m.positional) == ("mean", "learned")
    o = cfg.train.optimizer
    assert o.learning_rate == 1e-4
    assert (o.b2, o.eps, o.weight_decay, cfg.train.schedule.name) == (0.999, 1e-6, 0.0, "linear")
    assert m.attention_kwargs.num_landmarks == 64


def test_parse_arg_and_errors():
    a = config_lib.parse_arg("attention=nystrom, quick ,seed=2", attention="x", quick=False,
                             seed=0)
    assert (a.attention, a.quick, a.seed) == ("nystrom", True, 2)
    with pytest.raises(ValueError, match=r"config argument 'colour' .* allowed: \['attention'"):
        config("listops", "colour=red")
    with pytest.raises(ValueError, match=r"seed='x': expected int"):
        config("listops", "seed=x")
    with pytest.raises(ValueError, match=r"protocol='huge' is unknown for task 'listops'"):
        config("listops", "protocol=huge")
    with pytest.raises(ValueError, match=r"attention='bogus' is unknown; known methods"):
        config("listops", "attention=bogus")


def test_attention_budget_capped_to_length():
    assert config_lib.attention_kwargs("nystrom", max_length=48)["num_landmarks"] == 32
    assert config_lib.attention_kwargs("performer", max_length=4000)["num_features"] == 256
    assert config_lib.attention_kwargs("softmax", max_length=8) == {}
    for name in available_attentions():  # every registered method has config defaults
        assert isinstance(config_lib.attention_kwargs(name), dict)


def _schedule(name, lr, warmup, steps, cycle=None):
    cfg = ml_collections.ConfigDict({"train": {
        "steps": steps, "optimizer": {"learning_rate": lr},
        "schedule": {"name": name, "warmup_steps": warmup, "steps_per_cycle": cycle}}})
    return optim.make_schedule(cfg)


def test_schedules_hand_computed():
    rsqrt = _schedule("rsqrt", 0.05, 1000, 5000)  # LRA ListOps: peak 1.58e-3 at step 1000
    np.testing.assert_allclose(
        [float(rsqrt(s)) for s in (0, 500, 1000, 5000)],
        [0.0, 0.05 * 0.5 / math.sqrt(1000), 0.05 / math.sqrt(1000), 0.05 / math.sqrt(5000)],
        rtol=1e-6)
    cosine = _schedule("cosine", 1e-3, 312, 62400)
    np.testing.assert_allclose(
        [float(cosine(s)) for s in (156, 312, 312 + 31200, 312 + 62400)],
        [5e-4, 1e-3, 5e-4, 1e-3], rtol=1e-5)  # LRA's cycle restarts after steps_per_cycle
    linear = _schedule("linear", 1e-4, 1000, 5000)
    np.testing.assert_allclose(
        [float(linear(s)) for s in (0, 500, 1000, 3000, 5000)],
        [0.0, 5e-5, 1e-4, 5e-5, 0.0], rtol=1e-6, atol=1e-12)
    constant = _schedule("constant", 2.0, 4, 10)
    np.testing.assert_allclose([float(constant(s)) for s in (2, 4, 9)], [1.0, 2.0, 2.0])


def test_optimizer_is_decoupled_adamw_with_clipping():
    cfg = config("pathx", "quick")  # grad_clip_norm 1.0, weight decay 0.01
    cfg.train.schedule.update(name="constant", warmup_steps=0)
    tx = optim.make_optimizer(cfg)
    params = {"w": jnp.array([1.0, -2.0])}
    grads = {"w": jnp.array([30.0, 40.0])}  # norm 50 -> clipped to [0.6, 0.8]
    updates, _ = tx.update(grads, tx.init(params), params)
    lr, wd = 1e-3, 0.01
    # First Adam step: m_hat / sqrt(v_hat) = sign(g) (eps 1e-9 negligible).
    expected = -lr * (np.sign([30.0, 40.0]) + wd * np.array([1.0, -2.0]))
    np.testing.assert_allclose(updates["w"], expected, rtol=1e-5)
    cfg.train.grad_clip_norm = -1.0
    with pytest.raises(ValueError, match=r"`train.grad_clip_norm` must be a finite number > 0 or None; got -1.0"):
        optim.make_optimizer(cfg)
