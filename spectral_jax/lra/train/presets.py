"""From a task's presets to its config: what every config ``lra/<task>`` computes.

A config file holds its task's presets (one per protocol) and calls :func:`task_config`; the
ConfigDict returned is the whole config, nothing is derived after loading.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from spectral_jax import UsageError
from spectral_jax.lra.train import config_lib


def task_config(task: str, arg: str | None,
                presets: dict[str, dict[str, Any]]) -> ml_collections.ConfigDict:
    """``get_config(arg)`` of a task: its protocol's preset, with the method's fields computed.

    ``arg`` is parsed with :data:`config_lib.TASK_ARGS`. The model takes the preset's fields,
    ``max_length`` when the argument sets one, then the fields that depend on the method
    (:func:`method_model_fields`); its ``attention_kwargs`` (registry defaults, the preset's
    choices, budgets capped at ``max_length``) are computed by :func:`config_lib.build_config`.
    The bare word ``spt`` adds a self-pretraining stage of the preset's ``train.steps``
    (``train.pretrain_steps``, :mod:`spectral_jax.lra.train.pretrain`).

    Args:
        task: the task's registry name (``"listops"``).
        arg: the part after ``:`` in ``--config FILE.py:ARG``, or None.
        presets: protocol name -> ``{"data", "model", "train"[, "attention_kwargs"]}``.

    Raises:
        spectral_jax.UsageError: an unknown argument key, method or protocol.

    Example:
        >>> from spectral_jax.lra.configs.lra import listops
        >>> presets = listops.PRESETS
        >>> config = task_config("listops", "quick,attention=nystrom", presets)
        >>> config.model.attention_kwargs.to_dict()
        {'num_landmarks': 16, 'pinv_iterations': 6}
    """
    a = config_lib.parse_arg(arg, **config_lib.TASK_ARGS)
    protocol, preset = select_preset(task, a, presets)
    model = dict(preset["model"])
    if a.max_length is not None:
        model["max_length"] = a.max_length
    model.update(method_model_fields(a.attention, model))
    train = dict(preset["train"])
    if a.spt:  # self-pretraining as long as the fine-tune, unless the preset says otherwise
        train.setdefault("pretrain_steps", train["steps"])
    return config_lib.build_config(
        task=task, protocol=protocol, attention=a.attention, seed=a.seed,
        data=preset["data"], model=model, train=train,
        attention_overrides=preset.get("attention_kwargs", {}).get(a.attention),
    )


def select_preset(task: str, arg: ml_collections.ConfigDict,
                  presets: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The protocol that ``arg`` (parsed with :data:`config_lib.TASK_ARGS`) names, and its preset.

    Raises:
        spectral_jax.UsageError: a protocol ``presets`` does not have.

    Example:
        >>> a = config_lib.parse_arg("quick", **config_lib.TASK_ARGS)
        >>> select_preset("listops", a, {"quick": {"model": {}}})
        ('quick', {'model': {}})
    """
    protocol = "quick" if arg.quick else arg.protocol
    if protocol not in presets:
        raise UsageError(
            f"protocol={protocol!r} is unknown for task {task!r}; allowed: {sorted(presets)}"
        )
    return protocol, presets[protocol]


def method_model_fields(attention: str, preset_model: dict[str, Any]) -> dict[str, Any]:
    """The ``model`` fields that depend on the method, from its registry entry.

    Attention-weight dropout exists only for methods that form the weights (exact softmax), so
    others get ``attention_dropout_rate=0``; causal-only methods (``gated_linear``, a
    recurrence) get ``is_causal=True`` and mean pooling, because a causal CLS token at position
    0 would see only itself.

    Example:
        >>> method_model_fields("nystrom", {"attention_dropout_rate": 0.1})
        {'attention_dropout_rate': 0.0}
        >>> method_model_fields("gated_linear", {})["is_causal"]
        True
    """
    from spectral_jax.attention import ATTENTIONS

    spec = ATTENTIONS.get(attention)
    rate = preset_model.get("attention_dropout_rate", 0.0)
    fields = {"attention_dropout_rate": rate if spec is not None and spec.weight_dropout else 0.0}
    if spec is not None and spec.causal_only:
        fields.update(is_causal=True, pooling="mean")
    return fields
