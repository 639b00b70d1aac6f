"""``--config.FIELD=VALUE`` overrides: each parsed by its field's type, then the method re-derived.

As ``ml_collections.config_flags`` does, a value is read by the type of the field it sets: a
string field takes the text as it is (``--config.data.dir=2024`` is the folder ``"2024"``; a
quoted ``'cifar10'``, as scripts pass it, loses its quotes), an int field an integer (``1e3``
too), a float field a number, a bool field ``true``/``false`` (``1``/``0``, ``yes``/``no``);
``none`` sets any field but a string one to None. Fields whose default is None carry their
type (ml_collections placeholders, see ``config_lib``); a field without a known type takes a
Python literal, else the text.

Method defaults and budget caps are resolved after all overrides: when ``model.attention`` or
``model.max_length`` changed, ``model.attention_kwargs`` is re-derived for the final method and
length (:func:`resolve_attention`). ``--config.model.attention_kwargs.NAME=VALUE`` is applied
last, checked against the final method's parameters, and kept as given: an explicit value
beats the cap (the function then reports a budget it cannot use).
"""

from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Iterable
from typing import Any

import ml_collections
from ml_collections.config_flags import config_path

from spectral_jax import UsageError
from spectral_jax.lra.train import config_lib

_KWARGS = "model.attention_kwargs."
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_MISSING = (KeyError, AttributeError, IndexError, TypeError)


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]
                    ) -> ml_collections.ConfigDict:
    """Applies ``"a.b=VALUE"`` overrides to ``config`` (in place) and returns it.

    Raises:
        spectral_jax.UsageError: a malformed override, a field the config does not have (with the nearest
          names, or the ``model.attention_kwargs.`` path of a method parameter), a value its
          field's type cannot take, or a method parameter the final method does not take.

    Example:
        >>> cfg = config_lib.build_config(task="listops", protocol="quick", attention="nystrom",
        ...     seed=0, data={"dir": "d"}, model={"max_length": 128}, train={})
        >>> cfg = apply_overrides(cfg, ["data.dir=2024", "model.max_length=40"])
        >>> cfg.data.dir, cfg.model.attention_kwargs.num_landmarks
        ('2024', 32)
    """
    pairs = [_split(item) for item in overrides]
    schema = "model" in config and "attention_kwargs" in config.model
    built = (config.model.attention, config.model.max_length) if schema else None
    for key, raw in pairs:
        if not (schema and key.startswith(_KWARGS)):
            _set(config, key, raw)
    if schema:
        given = {key[len("model."):] for key, _ in pairs if key.startswith("model.")}
        resolve_attention(config, attention=built[0], max_length=built[1], given=given)
        for key, raw in pairs:
            if key.startswith(_KWARGS):
                _set_method_parameter(config, key, raw)
    return config


def parse_value(key: str, raw: str, kind: type) -> Any:
    """``raw`` read as a value of type ``kind`` for the field ``key``.

    Example:
        >>> parse_value("data.dir", "2024", str), parse_value("train.steps", "1e3", int)
        ('2024', 1000)
    """
    if kind is str:
        return _unquoted(raw)
    lowered = raw.strip().lower()
    if lowered == "none":
        return None
    if kind is bool:
        if lowered in _BOOLS:
            return _BOOLS[lowered]
        raise UsageError(f"--config.{key}={raw}: {key} is a bool field; expected true or false")
    if kind in (int, float):
        try:
            number = float(raw) if kind is float else int(raw)
        except ValueError:
            number = _integral(raw) if kind is int else None
        if number is None:
            article, example = ("an", "100") if kind is int else ("a", "0.001")
            raise UsageError(f"--config.{key}={raw}: {key} is {article} {kind.__name__} field; "
                             f"expected a number such as {example}")
        return number
    value = _literal(raw)
    container = dict if isinstance(kind, type) and issubclass(kind, ml_collections.ConfigDict) \
        else kind
    if container in (tuple, list, dict) and not isinstance(value, container):
        raise UsageError(f"--config.{key}={raw}: {key} is a {container.__name__} field; "
                         f"expected a Python {container.__name__} literal")
    return value


def resolve_attention(config: ml_collections.ConfigDict, *, attention: str,
                      max_length: int | None, given: Iterable[str] = ()) -> None:
    """Re-derives the method's parameters after overrides changed the method or the length.

    ``config`` was built for ``attention`` at ``max_length`` (``model.max_length``); when
    either now differs, ``model.attention_kwargs`` becomes the new method's registry defaults
    with the preset's choices for it (``config_lib.from_presets``'s ``attention_kwargs``), the
    budget capped at the new length, as ``FILE.py:attention=<method>`` would have built it.
    On a switch, the model fields a preset sets by method
    (``config_lib.method_model_fields``: ``attention_dropout_rate``) follow too, except those
    in ``given``.

    Args:
        config: the config, changed in place.
        attention: the method it was built for.
        max_length: the ``model.max_length`` it was built for.
        given: ``model`` fields the user overrode explicitly (kept).

    Example:
        >>> p = {"quick": {"data": {"dir": "d"}, "model": {"max_length": 512}, "train": {}}}
        >>> cfg = config_lib.from_presets("text", "quick,attention=linformer", p)
        >>> cfg.model.max_length = 100
        >>> resolve_attention(cfg, attention="linformer", max_length=512)
        >>> cfg.model.attention_kwargs.proj_len
        64
    """
    from spectral_jax.attention import ATTENTIONS

    model = config.model
    new = model.attention
    if (new, model.max_length) == (attention, max_length) or new not in ATTENTIONS:
        return  # unchanged, or an unknown name that validate_config reports with its field
    preset = getattr(config, config_lib._PRESET_ATTR, None)  # noqa: SLF001
    if preset is not None:
        choices = dict(preset["attention_kwargs"].get(new, {}))
    elif new == attention:  # a config without presets: its non-default values are choices
        built = config_lib.attention_kwargs(attention, max_length)
        choices = {k: v for k, v in model.attention_kwargs.items() if built.get(k) != v}
    else:
        choices = {}
    with model.ignore_type():
        model.attention_kwargs = ml_collections.ConfigDict(
            config_lib.attention_kwargs(new, model.max_length, choices))
    if new != attention:
        fields = config_lib.method_model_fields(new, preset["model"] if preset else model)
        for name, value in fields.items():
            if name not in set(given):
                model[name] = value


def _split(item: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--config.{item}: expected --config.FIELD=VALUE")
    return key, raw


def _set(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    try:
        kind = config_path.get_type(key, config)
    except _MISSING:
        raise UsageError(_unknown_field(config, key)) from None
    value = parse_value(key, raw, kind)
    try:
        config_path.set_value(key, config, value)
    except TypeError as e:
        raise UsageError(f"--config.{key}={raw}: {e}") from None


def _set_method_parameter(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    from spectral_jax.attention import ATTENTIONS
    from spectral_jax.nn._attention import allowed_attention_kwargs

    name, attention = key[len(_KWARGS):], config.model.attention
    if attention not in ATTENTIONS:
        raise UsageError(f"--config.model.attention={attention!r} is unknown; known methods: "
                         f"{sorted(ATTENTIONS)}")
    allowed = allowed_attention_kwargs(attention)
    if name not in allowed:
        takers = _methods_taking(name)
        hint = (f"; {name!r} is a parameter of {takers}: add --config.model.attention="
                f"{takers[0]}" if takers else "")
        raise UsageError(f"--config.{key}: attention={attention!r} takes no {name!r} "
                         f"(its parameters: {sorted(allowed)}){hint}")
    current = config.model.attention_kwargs.get(name)
    default = current if current is not None else _parameter_default(attention, name)
    value = parse_value(key, raw, type(default))
    with config.model.attention_kwargs.ignore_type():
        config.model.attention_kwargs[name] = value


def _parameter_default(attention: str, name: str) -> Any:
    from spectral_jax.attention import ATTENTIONS
    from spectral_jax.nn._attention import module_options

    param = inspect.signature(ATTENTIONS[attention].fn).parameters.get(name)
    if param is not None and param.default is not inspect.Parameter.empty:
        return param.default
    return module_options(attention).get(name)


def _methods_taking(name: str) -> list[str]:
    from spectral_jax.attention import available_attentions
    from spectral_jax.nn._attention import allowed_attention_kwargs

    return [m for m in available_attentions() if name in allowed_attention_kwargs(m)]


def _unknown_field(config: ml_collections.ConfigDict, key: str) -> str:
    message = f"--config.{key}: no field {key!r} in the config"
    name = key.rsplit(".", 1)[-1]
    takers = _methods_taking(name) if "model" in config else []
    if takers:
        message += (f"; {name!r} is a parameter of the attention method: set it as "
                    f"--config.model.attention_kwargs.{name}=VALUE")
        if config.model.get("attention") not in takers:
            message += f" with a method that takes it ({', '.join(takers)})"
        return message
    fields = list(_paths(config.to_dict()))
    close = [f for f in fields if f.rsplit(".", 1)[-1] == name]
    close += [f for f in difflib.get_close_matches(key, fields, n=3) if f not in close]
    return message + (f"; did you mean {' or '.join(close[:3])}?" if close else "")


def _paths(tree: dict[str, Any], prefix: str = "") -> Iterable[str]:
    for k, v in tree.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _paths(v, f"{prefix}{k}.")


def _integral(raw: str) -> int | None:
    try:
        number = float(raw)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def _unquoted(raw: str) -> str:
    """The text of a quoted Python string (``'cifar10'``, as scripts pass it), else ``raw``."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            return raw
        return value if isinstance(value, str) else raw
    return raw


def _literal(raw: str) -> Any:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return ast.literal_eval(raw)
    except (SyntaxError, ValueError):
        return raw
