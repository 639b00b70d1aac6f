"""What the LRA configs (``lra/<task>`` in ``spectral_jax.lra.configs``) share, in the style of
big_vision's ``configs/common.py``: the parser of
``get_config("attention=nystrom,protocol=small")``, the method-dependent values a config file
computes (attention defaults from the registry, budget caps, dropout and causal fields) and the
config schema.

A config file's ``get_config(arg)`` computes every field; the loaded ConfigDict is the whole
config (:mod:`spectral_jax.lra.train.overrides` re-runs ``get_config`` when an override sets a
field the argument determines, see :data:`ARG_FIELDS`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import ml_collections
from ml_collections import config_dict

from spectral_jax import UsageError, _checks
from spectral_jax.lra.data.registry import TASKS, task_options

PROTOCOLS = ("lra", "small", "quick")
# More batch lengths than this under train.bucket_multiple warn: each compiles the step once.
MAX_BUCKET_SHAPES = 16
# Model fields a config does not carry: the method is set by build_config, and parameters stay
# float32 (adding the field would change the config.json of every saved run).
_NOT_CONFIG_FIELDS = ("attention", "attention_kwargs", "param_dtype")

# The "small" protocol's model and optimizer are the same for every task (the Nystromformer /
# Skyformer comparison setup); task configs add vocab_size and max_length.
SMALL_MODEL: dict[str, Any] = {
    "num_layers": 2, "embed_dim": 64, "num_heads": 2, "qkv_dim": 64, "mlp_dim": 128,
    "dropout_rate": 0.1, "attention_dropout_rate": 0.1, "pooling": "mean",
    "positional": "learned",
}
SMALL_OPTIMIZER: dict[str, Any] = {
    "learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.0}
# The "quick" CPU smoke runs share one AdamW setting across tasks.
QUICK_OPTIMIZER: dict[str, Any] = {
    "learning_rate": 1e-3, "b1": 0.9, "b2": 0.98, "eps": 1e-9, "weight_decay": 0.01}

# The argument every lra/<task> config takes: ``attention=<method>``, ``protocol=lra|small|quick``
# (the bare word ``quick`` is ``protocol=quick``), ``seed=<int>`` and ``max_length=<int>`` (the
# model's length; None keeps the protocol's, and budgets are capped at it).
TASK_ARGS: dict[str, Any] = {
    "attention": "spectral_shift", "protocol": "lra", "quick": False, "seed": 0,
    "max_length": int, "spt": False,
}
# The self-pretraining stage's train fields (spectral_jax.lra.train.pretrain); the bare
# argument ``spt`` sets pretrain_steps to the preset's train.steps. A run recorded without
# them did not pretrain: workdir.config_mismatch reads them as these defaults.
PRETRAIN_DEFAULTS: dict[str, Any] = {
    "pretrain_steps": 0, "pretrain_objective": "auto", "pretrain_mask_rate": 0.5}
# Fields added after runs were recorded: a recorded run without them had these values.
RECORDED_DEFAULTS: dict[str, Any] = {**PRETRAIN_DEFAULTS, "init_from": None,
                                     "bucket_multiple": 0, "bucket_window": 32}
# Config fields that an lra/<task> config's argument determines: an override of one re-runs
# get_config with that argument (fields derived from it follow) instead of setting the field
# alone.
ARG_FIELDS: dict[str, str] = {
    "model.attention": "attention", "model.max_length": "max_length", "protocol": "protocol",
}


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
    """Parses ``"key=value,key2=value2"`` (the part after ``:`` in ``--config file.py:arg``).

    Values are converted to the type of the default (int, float, bool or str); a default given
    as a type (``max_length=int``) means None unless the argument sets it. A bare word such as
    ``quick`` sets the boolean default of that name to True.

    Args:
        arg: the argument string, or None / "" for all defaults.
        **defaults: allowed keys and their default values (or types).

    Returns:
        A ConfigDict with every default key.

    Raises:
        spectral_jax.UsageError: for a key that is not one of ``defaults`` or a value of the
          wrong type.

    Example:
        >>> parse_arg("attention=nystrom,quick", attention="softmax", quick=False).quick
        True
    """
    result = ml_collections.ConfigDict(
        {k: config_dict.placeholder(v) if isinstance(v, type) else v for k, v in defaults.items()})
    for item in filter(None, (part.strip() for part in (arg or "").split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise UsageError(
                f"config argument {key!r} (in {arg!r}) is unknown; allowed: {sorted(defaults)}"
            )
        default = defaults[key]
        if not sep:
            if not isinstance(default, bool):
                raise UsageError(f"config argument {key!r} needs a value, e.g. {key}={default}")
            result[key] = True
            continue
        result[key] = _convert(key, raw.strip(), default)
    return result


def _convert(key: str, raw: str, default: Any) -> Any:
    if isinstance(default, type):
        default = default()
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise UsageError(f"config argument {key}={raw!r}: expected true or false")
        return raw.lower() in ("true", "1")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(raw)
            except ValueError:
                raise UsageError(
                    f"config argument {key}={raw!r}: expected {kind.__name__}"
                ) from None
    return raw


def attention_kwargs(attention: str, max_length: int | None = None,
                     choices: dict[str, Any] | None = None) -> dict[str, Any]:
    """Default parameters of an attention method (its registry entry), budget capped at the length.

    Args:
        attention: registry name (see ``spectral_jax.attention.available_attentions()``).
        max_length: when given, landmark / feature / projection counts larger than the sequence
          are reduced to the largest power of two not above it (a budget above the length would
          not be an approximation).
        choices: a preset's values replacing the registry defaults (capped the same way).

    Raises:
        spectral_jax.UsageError: for an unknown method name.

    Example:
        >>> attention_kwargs("nystrom", max_length=48)["num_landmarks"]
        32
    """
    from spectral_jax import attention as attention_lib

    if attention not in attention_lib.ATTENTIONS:
        raise UsageError(
            f"attention={attention!r} is unknown; known methods: "
            f"{sorted(attention_lib.available_attentions())}"
        )
    # The registry records each method's parameters and which one is its budget.
    spec = attention_lib.get_attention_spec(attention)
    kwargs = {**spec.config_defaults(), **(choices or {})}
    if max_length is not None and spec.budget in kwargs:
        cap = 1 << (max_length.bit_length() - 1)
        kwargs[spec.budget] = min(kwargs[spec.budget], cap)
    return kwargs


def build_config(
    *,
    task: str,
    protocol: str,
    attention: str,
    seed: int,
    data: dict[str, Any],
    model: dict[str, Any],
    train: dict[str, Any],
    attention_overrides: dict[str, Any] | None = None,
) -> ml_collections.ConfigDict:
    """Assembles a training config with the full schema, filling shared defaults.

    Args:
        task: one of :data:`TASKS`.
        protocol: one of :data:`PROTOCOLS` (``quick`` is the CPU preset).
        attention: registry name of the attention method.
        seed: seeds parameters, dropout and data order.
        data: ``dir`` (where the task's files are), ``options`` (passed to
          ``spectral_jax.lra.data.load_task``) and optionally ``generate`` (ListOps generator
          arguments, used when ``dir`` is missing).
        model: fields of :class:`spectral_jax.nn.TransformerConfig` except ``vocab_size`` and
          ``num_classes`` when they come from the data (None = take the task's).
        train: loop settings; see the config ``lra/listops`` for every key.
        attention_overrides: method parameters replacing the defaults (the budget is still
          capped at ``model["max_length"]``).

    Returns:
        An unlocked ConfigDict.

    Raises:
        spectral_jax.UsageError: for an unknown task, protocol or attention method.

    Example:
        >>> cfg = build_config(task="listops", protocol="quick", attention="softmax", seed=0,
        ...                    data={"dir": "d"}, model={"max_length": 64}, train={"steps": 10})
        >>> cfg.train.optimizer.b2
        0.999
    """
    _checks.choice("config", "task", task, TASKS)
    _checks.choice("config", "protocol", protocol, PROTOCOLS)
    kwargs = attention_kwargs(attention, model.get("max_length"), attention_overrides)

    cfg = ml_collections.ConfigDict()
    cfg.task = task
    cfg.protocol = protocol
    cfg.seed = seed
    # Every reader option is present (at its default), so each can be set from the command
    # line (ml_collections refuses fields that do not exist).
    options = {**task_options(task), **data.get("options", {})}
    cfg.data = ml_collections.ConfigDict(
        {"dir": data["dir"], "options": options, "generate": data.get("generate")}
    )
    defaults = model_defaults()
    unknown = sorted(set(model) - set(defaults))
    if unknown:
        raise UsageError(f"build_config: model has {unknown}, which are not TransformerConfig "
                         f"fields (allowed: {sorted(defaults)})")
    cfg.model = ml_collections.ConfigDict(_typed({**defaults, **model}, model_types()))
    cfg.model.attention = attention
    cfg.model.attention_kwargs = ml_collections.ConfigDict(kwargs)
    train_defaults = {
        "steps": 1000, "batch_size": 32, "eval_batch_size": None, "eval_every": 100,
        "eval_steps": -1, "log_every": 50, "keep_checkpoints": 2, "grad_clip_norm": None,
        "redraw_features_every": 0, **RECORDED_DEFAULTS,
        "optimizer": {"learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-6,
                      "weight_decay": 0.0},
        "schedule": {"name": "linear", "warmup_steps": 0, "steps_per_cycle": None},
        # Devices one sequence is split over (the data axis takes the rest): see
        # spectral_jax.lra.train.distributed.make_mesh.
        "mesh": {"seq": 1},
    }
    merged = {**train_defaults, **train}
    for group in ("optimizer", "schedule", "mesh"):
        merged[group] = {**train_defaults[group], **train.get(group, {})}
    cfg.train = ml_collections.ConfigDict(_typed(merged, _TRAIN_TYPES))
    cfg.train.schedule = ml_collections.ConfigDict(_typed(merged["schedule"], _TRAIN_TYPES))
    return cfg


# The types of fields whose default is None, so that a command-line override is parsed by
# type (ml_collections placeholders; config.json is unchanged: a placeholder is null).
_TRAIN_TYPES = {"eval_batch_size": int, "grad_clip_norm": float, "steps_per_cycle": int,
                "init_from": str}


def _typed(values: dict[str, Any], types: dict[str, type]) -> dict[str, Any]:
    return {k: config_dict.placeholder(types[k]) if v is None and k in types else v
            for k, v in values.items()}


def model_types() -> dict[str, type]:
    """The type of each ``model`` field that is a plain int, float, bool or str.

    Example:
        >>> model_types()["vocab_size"], model_types()["dropout_rate"]
        (<class 'int'>, <class 'float'>)
    """
    import typing

    from spectral_jax.nn import TransformerConfig

    hints = typing.get_type_hints(TransformerConfig)
    return {name: hint for name, hint in hints.items() if hint in (int, float, bool, str)}


def model_defaults() -> dict[str, Any]:
    """The ``model`` section's fields and defaults: those of ``nn.TransformerConfig``.

    Sizes the data gives (``vocab_size``, ``num_classes``, ``max_length``) default to None
    (take the task's); dtypes are names.

    Example:
        >>> model_defaults()["pooling"], model_defaults()["vocab_size"], model_defaults()["dtype"]
        ('mean', None, 'float32')
    """
    import numpy as np

    from spectral_jax.nn import TransformerConfig

    out: dict[str, Any] = {}
    for field in dataclasses.fields(TransformerConfig):
        if field.name in _NOT_CONFIG_FIELDS:
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        out[field.name] = np.dtype(default).name if field.name == "dtype" else default
    return out


_OWNER = "config"


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks a training config's names and numbers before anything is loaded or compiled.

    Args:
        config: a config built by :func:`build_config` (possibly with overrides).

    Raises:
        spectral_jax.UsageError: unknown task, protocol, attention method, schedule, pooling or
          positional encoding; a non-positive step count, batch size or interval; missing sections.
        spectral_jax.UsageTypeError: a value of the wrong kind (a string step count); see
          :mod:`spectral_jax._checks` for the rule.

    Example:
        >>> validate_config(build_config(task="listops", protocol="quick", attention="softmax",
        ...     seed=0, data={"dir": "d"}, model={}, train={}))
    """
    from spectral_jax import attention as attention_lib
    from spectral_jax.lra.train.steps import SCHEDULES
    from spectral_jax.nn import TransformerConfig, allowed_attention_kwargs

    for section in ("data", "model", "train"):
        if section not in config:
            raise UsageError(f"config has no {section!r} section; build it with build_config()")
    _checks.choice(_OWNER, "task", config.task, TASKS)
    _checks.choice(_OWNER, "protocol", config.protocol, PROTOCOLS)
    _checks.choice(_OWNER, "model.attention", config.model.attention,
                   attention_lib.available_attentions())
    _checks.choice(_OWNER, "train.schedule.name", config.train.schedule.name, SCHEDULES)
    train = config.train
    for name in ("steps", "batch_size", "eval_every", "log_every", "keep_checkpoints"):
        _checks.positive_int(_OWNER, f"train.{name}", train[name])
    _checks.positive_int(_OWNER, "train.eval_batch_size", train.eval_batch_size, allow_none=True)
    if train.eval_steps != -1:
        _checks.positive_int(_OWNER, "train.eval_steps", train.eval_steps)
    _checks.nonnegative_int(_OWNER, "seed", config.seed)
    _checks.nonnegative_int(_OWNER, "train.redraw_features_every", train.redraw_features_every)
    model = config.model
    spec = attention_lib.get_attention_spec(model.attention)  # the name is resolved here, once
    _check_buckets(train, model.max_length)
    allowed = allowed_attention_kwargs(spec)
    unknown = sorted(set(model.attention_kwargs.to_dict()) - allowed)
    if unknown:
        raise UsageError(
            f"model.attention_kwargs has {unknown}, which attention={model.attention!r} does not "
            f"take (allowed: {sorted(allowed)}). To switch a preset to another method, use the "
            f"config argument, e.g. --config lra/{config.task}:attention={model.attention} "
            f"(or --config.model.attention={model.attention}, which re-runs get_config with it), "
            "which brings that method's own attention_kwargs"
        )
    TransformerConfig.check_fields(model.to_dict(), owner=_OWNER, prefix="model.")
    _check_causal(model, spec)
    opt = train.optimizer
    for name in ("b1", "b2"):
        _checks.number(_OWNER, f"train.optimizer.{name}", opt[name], low=0.0, high=1.0,
                       high_open=True)
    _checks.number(_OWNER, "train.optimizer.eps", opt.eps, low=0.0, low_open=True)
    _checks.number(_OWNER, "train.optimizer.weight_decay", opt.weight_decay, low=0.0)
    _checks.positive_int(_OWNER, "train.schedule.steps_per_cycle", train.schedule.steps_per_cycle,
                         allow_none=True)
    from spectral_jax.lra.train import pretrain, warm_start

    pretrain.check_config(config)
    warm_start.check_config(config)


def _check_buckets(train: ml_collections.ConfigDict, max_length: int) -> None:
    """``train.bucket_multiple`` (0: off) and ``train.bucket_window``: a bucketed batch is
    shorter than the model's length, which a sequence split over devices cannot follow; a
    warning when the multiple allows more batch lengths (each compiled once) than
    ``MAX_BUCKET_SHAPES``."""
    _checks.nonnegative_int(_OWNER, "train.bucket_multiple", train.bucket_multiple)
    _checks.positive_int(_OWNER, "train.bucket_window", train.bucket_window)
    if train.bucket_multiple and train.mesh.seq > 1:
        raise UsageError(
            f"train.bucket_multiple={train.bucket_multiple} with train.mesh.seq="
            f"{train.mesh.seq}: a sequence split over devices needs one fixed length; set "
            "one of them to its default (0, 1)")
    if not train.bucket_multiple or not isinstance(max_length, int):
        return  # off, or the task's length, known once its data is read
    shapes = -(-max_length // train.bucket_multiple)
    if shapes > MAX_BUCKET_SHAPES:
        warnings.warn(
            f"train.bucket_multiple={train.bucket_multiple} with model.max_length={max_length}"
            f" allows up to {shapes} batch lengths, and each compiles the training step once;"
            f" a multiple of at least {-(-max_length // MAX_BUCKET_SHAPES)} keeps that to "
            f"{MAX_BUCKET_SHAPES}.", stacklevel=3)


def _check_causal(model: ml_collections.ConfigDict, spec: Any) -> None:
    causal = model.get("is_causal", False)
    if not isinstance(causal, bool):
        raise UsageError(f"model.is_causal={causal!r} must be a bool")
    if spec.causal_only and not causal:
        raise UsageError(
            f"attention={spec.name!r} is causal only: set model.is_causal=True (the "
            f"lra/<task> presets do it) with model.pooling='mean' or 'last'")
    if causal and not spec.supports_causal:
        raise UsageError(f"model.is_causal=True but attention={spec.name!r} has no causal form")
    if causal and model.pooling == "cls":
        raise UsageError(
            "model.is_causal=True with model.pooling='cls': the CLS token at position 0 would "
            "see only itself; use model.pooling='mean' or 'last'")
