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
from spectral_jax.lra.data.registry import LRA_TASKS
from spectral_jax.lra.train import config_lib
from spectral_jax.lra.train import steps as optim
from spectral_jax.lra.train.overrides import load_config

ROOT = Path(__file__).resolve().parents[1]


def config(task: str, arg: str = "") -> ml_collections.ConfigDict:
    return load_config(f"lra/{task}" + (f":{arg}" if arg else ""))


@pytest.mark.parametrize("task", LRA_TASKS)
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


@pytest.mark.parametrize("task", LRA_TASKS)
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
    with pytest.raises(ValueError, match=r"`train.grad_clip_norm` must be a finite number > 0 "
                       r"or None; got -1.0"):
        optim.make_optimizer(cfg)


def test_causal_only_methods_get_a_causal_mean_pooled_config():
    # The lra protocol pools by CLS; a causal-only method gets mean pooling and is_causal.
    assert config("listops").model.pooling == "cls"
    cfg = config("listops", "attention=gated_linear")
    assert cfg.model.is_causal is True and cfg.model.pooling == "mean"
    config_lib.validate_config(cfg)
    cfg.model.pooling = "cls"
    with pytest.raises(ValueError, match="pooling='cls'"):
        config_lib.validate_config(cfg)
    cfg.model.update(pooling="mean", is_causal=False)
    with pytest.raises(ValueError, match="causal only.*model.is_causal=True"):
        config_lib.validate_config(cfg)
    cfg.model.attention = "luna"
    cfg.model.attention_kwargs = {"packed_length": 4}
    cfg.model.is_causal = True
    with pytest.raises(ValueError, match="no causal form"):
        config_lib.validate_config(cfg)


@pytest.mark.parametrize("spec, expected", [
    ("listops:quick", {"num_landmarks": 16, "pinv_iterations": 6, "shift": "paired",
                       "num_delta_rows": None}),
    ("listops:quick,attention=linformer", {"proj_len": 32}),
    ("listops:quick,attention=performer", {"num_features": 64}),
    ("listops:attention=linformer", {"proj_len": 256}),
    ("listops:protocol=small,attention=nystrom", {"num_landmarks": 64, "pinv_iterations": 6}),
    ("text:quick,attention=performer", {"num_features": 256}),
    ("text:attention=nystrom,max_length=48", {"num_landmarks": 32, "pinv_iterations": 6}),
    ("pathx:quick,attention=softmax", {}),
])
def test_attention_kwargs_by_value(spec, expected):
    # The registry's defaults, the quick presets' smaller budgets, the cap at max_length.
    task, _, arg = spec.partition(":")
    assert config(task, arg).model.attention_kwargs.to_dict() == expected


@pytest.mark.parametrize("task", LRA_TASKS)
def test_method_dependent_model_fields(task):
    lra_dropout = config(task, "attention=softmax").model.attention_dropout_rate
    assert lra_dropout == (0.2 if task == "image" else 0.1)
    for attention in ("nystrom", "linformer", "gated_linear"):
        model = config(task, f"attention={attention}").model
        assert model.attention_dropout_rate == 0.0
        assert model.is_causal is (attention == "gated_linear")
        if attention == "gated_linear":
            assert model.pooling == "mean"
    assert config(task, "quick,max_length=40").model.max_length == 40


def _load(spec: str, *overrides: str) -> ml_collections.ConfigDict:
    return load_config(f"lra/{spec}", list(overrides))


@pytest.mark.parametrize("task", LRA_TASKS)
def test_argument_fields_override_by_re_running_get_config(task):
    for method in ("linformer", "softmax", "gated_linear"):
        switched = _load(f"{task}:quick", f"model.attention={method}", "train.steps=3")
        direct = _load(f"{task}:quick,attention={method}", "train.steps=3")
        assert switched.to_dict() == direct.to_dict(), method
    assert (_load(f"{task}:attention=nystrom", "model.max_length=40").to_dict()
            == _load(f"{task}:attention=nystrom,max_length=40").to_dict())
    assert (_load(f"{task}:quick,seed=2", "protocol=small").to_dict()
            == _load(f"{task}:protocol=small,seed=2").to_dict())


def test_overrides_after_the_argument_are_kept_in_any_order():
    cfg = _load("listops:quick", "model.attention_kwargs.proj_len=8",
                "model.attention=linformer", "model.max_length=64")
    assert cfg.model.attention_kwargs.to_dict() == {"proj_len": 8}
    assert cfg.model.max_length == 64
    assert (_load("listops:quick", "model.attention='nystrom'").to_dict()
            == _load("listops:quick,attention=nystrom").to_dict())
    cfg = _load("listops:quick", "model.attention_kwargs.num_delta_rows=4")
    assert cfg.model.attention_kwargs.num_delta_rows == 4  # a None field takes a literal


def test_the_loaded_config_is_the_whole_config():
    import json

    cfg = _load("listops:quick", "model.attention=nystrom")
    # No state beyond the fields: the same attributes as an empty ConfigDict, and its JSON
    # rebuilds an equal config.
    assert set(vars(cfg)) == set(vars(ml_collections.ConfigDict()))
    assert ml_collections.ConfigDict(json.loads(cfg.to_json())).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("override, message", [
    ("model.attention=bogus", r"--config.model.attention=bogus \(re-runs get_config with "
                              r"'attention=bogus'\): attention='bogus' is unknown; known methods: "
                              r"\['clustered'"),
    ("protocol=huge", r"--config.protocol=huge .*protocol='huge' is unknown for task "
                      r"'listops'; allowed: \['lra', 'quick', 'small'\]"),
    ("model.max_length=long", r"--config.model.max_length=long .*max_length='long': "
                              r"expected int"),
    ("model.attention_kwargs.proj_len=3", r"attention='spectral_shift' takes no 'proj_len' "
                                          r"\(its parameters: .*add --config.model.attention="
                                          r"linformer"),
    ("model.attention_kwargs.num_landmarks=many", r"num_landmarks=many: .*num_landmarks is an "
                                                  r"int field"),
])
def test_bad_overrides_name_the_field_the_value_and_what_is_allowed(override, message):
    with pytest.raises(config_lib.UsageError, match=message):
        _load("listops:quick", override)


def test_with_arguments_replaces_the_named_items():
    from spectral_jax.lra.train.overrides import with_arguments

    assert with_arguments(None, {"attention": "nystrom"}) == "attention=nystrom"
    assert with_arguments("quick,attention=linear,seed=1", {"attention": "nystrom"}) == (
        "quick,seed=1,attention=nystrom")
    assert with_arguments("quick", {"protocol": "small"}) == "protocol=small"
    assert with_arguments("protocol=lra", {}) == "protocol=lra"


@pytest.mark.parametrize("field, value, message", [
    ("attention", "bogus", r"`model.attention` must be one of \(.*'softmax'.*; got 'bogus'"),
    ("protocol", "huge", r"`protocol` must be one of .*; got 'huge'"),
])
def test_argument_fields_set_directly_are_checked_before_anything_runs(tmp_path, field, value,
                                                                       message):
    from spectral_jax.lra.train.loop import train_and_evaluate

    cfg = config("listops", "quick")
    cfg.data.dir = str(tmp_path / "listops")
    (cfg.model if field == "attention" else cfg)[field] = value
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "listops").exists()  # raised before generating data
