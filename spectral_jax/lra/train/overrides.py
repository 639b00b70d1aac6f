"""``--config.FIELD=VALUE`` overrides of a config file's ``get_config(arg)``.

``--config`` names a config shipped in :mod:`spectral_jax.lra.configs` (``lra/listops:quick``
is ``spectral_jax/lra/configs/lra/listops.py`` with the argument ``quick``) or the path of any
file that defines ``get_config(arg)`` (``my_config.py:quick``); a path that exists wins.

An override of a field that the file's argument determines (:data:`config_lib.ARG_FIELDS`:
``model.attention``, ``model.max_length``, ``protocol``) re-runs ``get_config`` with that
argument, so ``--config.model.attention=X`` is ``FILE.py:...,attention=X`` and every field that
follows from the method (its ``attention_kwargs``, weight dropout, causality) is the file's
own. Every other override then sets one field, in order, as ``ml_collections.config_flags``
does: the value is read by the type of the field it sets. A string field takes the text as it
is (``--config.data.dir=2024`` is the folder ``"2024"``; a quoted ``'cifar10'``, as scripts pass
it, loses its quotes), an int field an integer (``1e3`` too), a float field a number, a bool
field ``true``/``false`` (``1``/``0``, ``yes``/``no``); ``none`` sets any field but a string one
to None. Fields whose default is None carry their type (ml_collections placeholders, see
``config_lib``); a field without a known type takes a Python literal, else the text. Nothing is
derived after the overrides: the ConfigDict returned is the config.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.machinery
import importlib.resources
import importlib.util
import inspect
import os
import types
from collections.abc import Callable, Iterable
from typing import Any

import ml_collections
from ml_collections.config_flags import config_path

from spectral_jax import UnknownNameError, UsageError
from spectral_jax.lra.train import config_lib

# The package that holds the shipped configs (``--config lra/listops`` names one of them).
CONFIG_PACKAGE = "spectral_jax.lra.configs"
_KWARGS = "model.attention_kwargs."
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_MISSING = (KeyError, AttributeError, IndexError, TypeError)


def load_config(spec: str, overrides: list[str] = ()) -> ml_collections.ConfigDict:
    """Loads ``NAME[:ARG]`` or ``FILE.py[:ARG]`` and applies ``a.b=VALUE`` overrides.

    Args:
        spec: a shipped config's name (``lra/listops``, see :func:`available_configs`) or the
          path of a config file defining ``get_config(arg)``, optionally followed by ``:arg``.
        overrides: ``"a.b=VALUE"`` strings, each parsed by its field's type; one that sets
          ``model.attention`` or ``model.max_length`` re-runs ``get_config`` with that argument
          (see the module docstring).

    Returns:
        The config.

    Raises:
        FileNotFoundError: a path ending in ``.py`` with no file there.
        spectral_jax.UnknownNameError: a name that is neither a file nor a shipped config (the
          message lists the shipped ones).
        spectral_jax.UsageError: a file without ``get_config``, a malformed override, an
          unknown field or a value of the wrong type.

    Example:
        >>> cfg = load_config("lra/listops:quick", ["train.steps=10"])
        >>> cfg.train.steps
        10
    """
    path, _, arg = spec.partition(":")
    module = config_module(path, spec)
    if not hasattr(module, "get_config"):
        raise UsageError(f"--config {spec!r}: {path} defines no get_config(arg)")
    return load(module.get_config, arg or None, overrides)


def available_configs() -> list[str]:
    """The names of the configs shipped in ``spectral_jax.lra.configs``: ``group/name``.

    Example:
        >>> "lra/listops" in available_configs()
        True
    """
    root = importlib.resources.files(CONFIG_PACKAGE)
    return sorted(f"{group.name}/{entry.name[:-3]}" for group in root.iterdir()
                  if group.is_dir() and not group.name.startswith("_")
                  for entry in group.iterdir()
                  if entry.name.endswith(".py") and not entry.name.startswith("_"))


def config_module(path: str, spec: str | None = None) -> types.ModuleType:
    """The config module that ``path`` (``--config``'s part before ``:``) names.

    An existing file is loaded from its path; otherwise ``path`` is the name of a shipped
    config (``lra/listops`` is ``spectral_jax/lra/configs/lra/listops.py``).

    Raises:
        FileNotFoundError: ``path`` ends in ``.py`` and no file is there.
        spectral_jax.UnknownNameError: ``path`` is not a shipped config's name.

    Example:
        >>> config_module("lra/listops").__name__
        'spectral_jax.lra.configs.lra.listops'
    """
    spec = path if spec is None else spec
    if os.path.isfile(path):
        # The loader is named: a path without the .py suffix is still Python source.
        loader = importlib.machinery.SourceFileLoader("_spectral_jax_config", path)
        module_spec = importlib.util.spec_from_loader(loader.name, loader)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    names = available_configs()
    if path in names:
        return importlib.import_module(f"{CONFIG_PACKAGE}.{path.replace('/', '.')}")
    shipped = [name for name in names if path.endswith(f"{name}.py")]
    hint = f"; the shipped config is --config {shipped[0]}" if shipped else ""
    if path.endswith(".py"):
        raise FileNotFoundError(f"--config {spec!r}: no config file at {path!r}{hint} "
                                f"(shipped configs: {', '.join(names)})")
    raise UnknownNameError(f"--config {spec!r}: {path!r} is neither a config file nor a "
                           f"shipped config; shipped configs: {', '.join(names)}")


def load(get_config: Callable[[str | None], ml_collections.ConfigDict], arg: str | None,
         overrides: Iterable[str] = ()) -> ml_collections.ConfigDict:
    """``get_config(arg)`` with ``"a.b=VALUE"`` overrides applied.

    Overrides of :data:`config_lib.ARG_FIELDS` go into the argument (``model.attention=X``
    becomes ``attention=X``) and ``get_config`` runs once with it; the others then set their
    field in order (:func:`set_field`).

    Args:
        get_config: a config file's ``get_config``.
        arg: the text after ``:`` in ``--config FILE.py:ARG`` (None or "" for none).
        overrides: ``"a.b=VALUE"`` strings.

    Returns:
        The config.

    Raises:
        spectral_jax.UsageError: a malformed override, an argument value ``get_config`` refuses,
          a field the config does not have (with the nearest names, or the
          ``model.attention_kwargs.`` path of a method parameter), a value its field's type
          cannot take, or a method parameter the method does not take.

    Example:
        >>> get_config = config_module("lra/listops").get_config
        >>> cfg = load(get_config, "quick", ["model.attention=linformer", "data.dir=2024"])
        >>> cfg.model.attention_kwargs.to_dict(), cfg.data.dir
        ({'proj_len': 32}, '2024')
    """
    pairs = [_split(item) for item in overrides]
    # A quoted value ('nystrom', as scripts pass it) is the text inside the quotes.
    given = {config_lib.ARG_FIELDS[key]: (key, _unquoted(raw)) for key, raw in pairs
             if key in config_lib.ARG_FIELDS}
    try:
        config = get_config(with_arguments(arg, {name: raw for name, (_, raw) in given.items()})
                            or None)
    except UsageError as e:
        if not given:
            raise
        sets = ", ".join(f"--config.{key}={raw}" for key, raw in given.values())
        args = ",".join(f"{name}={raw}" for name, (_, raw) in given.items())
        raise UsageError(f"{sets} (re-runs get_config with {args!r}): {e}") from None
    for key, raw in pairs:
        if key not in config_lib.ARG_FIELDS:
            set_field(config, key, raw)
    return config


def with_arguments(arg: str | None, values: dict[str, str]) -> str:
    """``arg`` with each ``name=value`` of ``values`` replacing that name's item.

    ``protocol`` also replaces the bare word ``quick`` (its short form).

    Example:
        >>> with_arguments("quick,attention=nystrom", {"attention": "softmax"})
        'quick,attention=softmax'
        >>> with_arguments("quick,seed=1", {"protocol": "small"})
        'seed=1,protocol=small'
    """
    replaced = set(values) | ({"quick"} if "protocol" in values else set())
    items = [item for item in (part.strip() for part in (arg or "").split(","))
             if item and item.partition("=")[0].strip() not in replaced]
    return ",".join([*items, *(f"{name}={value}" for name, value in values.items())])


def set_field(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Sets the field ``key`` (``"a.b.c"``) of ``config`` to ``raw`` read by the field's type.

    A method parameter that the config's method takes but does not record
    (``model.attention_kwargs.NAME``) is added, read by the type of its default.

    Raises:
        spectral_jax.UsageError: a field the config does not have, a value its type cannot
          take, or a method parameter the config's method does not take.

    Example:
        >>> cfg = config_lib.build_config(task="listops", protocol="quick", attention="nystrom",
        ...     seed=0, data={"dir": "d"}, model={"max_length": 128}, train={})
        >>> set_field(cfg, "train.steps", "1e3"); set_field(cfg, "data.dir", "2024")
        >>> cfg.train.steps, cfg.data.dir
        (1000, '2024')
    """
    if key.startswith(_KWARGS) and "model" in config and "attention_kwargs" in config.model:
        _set_method_parameter(config, key, raw)
    else:
        _set(config, key, raw)


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
            article, what = ("an", "an integer such as 100") if kind is int else (
                "a", "a number such as 0.001")
            raise UsageError(f"--config.{key}={raw}: {key} is {article} {kind.__name__} field; "
                             f"expected {what}")
        return number
    value = _literal(raw)
    container = dict if isinstance(kind, type) and issubclass(kind, ml_collections.ConfigDict) \
        else kind
    if container in (tuple, list, dict) and not isinstance(value, container):
        raise UsageError(f"--config.{key}={raw}: {key} is a {container.__name__} field; "
                         f"expected a Python {container.__name__} literal")
    return value


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
    from spectral_jax.nn import allowed_attention_kwargs

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
    from spectral_jax.nn import module_options

    param = inspect.signature(ATTENTIONS[attention].fn).parameters.get(name)
    if param is not None and param.default is not inspect.Parameter.empty:
        return param.default
    return module_options(attention).get(name)


def _methods_taking(name: str) -> list[str]:
    from spectral_jax.attention import available_attentions
    from spectral_jax.nn import allowed_attention_kwargs

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
