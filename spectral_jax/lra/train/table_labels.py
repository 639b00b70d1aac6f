"""Row labels of the results tables: the method and what ran, e.g. ``nystrom (quick)``.

A run records its whole config, and its ``protocol`` names the preset it started from. The
protocol alone is the label only when the config is that preset unchanged: the preset is
rebuilt from the task's shipped config (``lra/<task>``, in :mod:`spectral_jax.lra.configs`)
for the run's method, and the fields that differ are named, e.g.
``nystrom (quick, steps=300)``, or counted past two: ``nystrom (quick, custom: 5 fields)``.
A run with a self-pretraining stage (``train.pretrain_steps > 0``) is compared with the
preset's ``spt`` form, and says so: ``nystrom (quick, spt, pretrain_steps=2000)``; the mask
id that denoising adds to the recorded ``model.vocab_size`` is no change.
Fields one side lacks (added or removed since the run), fields the preset leaves None (filled
in from the data at train time) and ``data.dir`` (where the data lies, not what it is) are
not differences. Without the config file the label says
so: ``nystrom (quick, preset not found)``. A run recorded without its config keeps
``nystrom (quick)``.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

from spectral_jax import UsageError

# Shown as key=value up to this many differing fields; more are counted.
_SHOWN = 2
_NOT_DIFFERENCES = ("seed", "data.dir")


def run_label(record: dict[str, Any]) -> str:
    """``"<method> (<what ran>)"`` for one run's results (see the module docstring).

    Args:
        record: a run's ``results.json`` contents (``attention``, ``protocol``, ``task``
          and, when recorded, ``config``).

    Example:
        >>> run_label({"attention": "nystrom", "protocol": "quick", "task": "listops"})
        'nystrom (quick)'
    """
    method, protocol = record["attention"], record["protocol"]
    config = record.get("config")
    if not isinstance(config, dict):
        return f"{method} ({protocol})"
    spt = int(config.get("train", {}).get("pretrain_steps") or 0) > 0
    preset = _preset(record["task"], protocol, method, spt)
    if preset is None:
        return f"{method} ({protocol}, preset not found)"
    changed = config_changes(config, preset)
    parts = [protocol, *(["spt"] if spt else []), *describe_changes(changed)]
    return f"{method} ({', '.join(parts)})"


def config_changes(config: dict[str, Any], preset: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``config`` whose values differ from ``preset``'s: ``{"a.b": value}``.

    Example:
        >>> config_changes({"train": {"steps": 300, "batch_size": 32}, "new": 1},
        ...                {"train": {"steps": 3500, "batch_size": 32}})
        {'train.steps': 300}
    """
    ran, base = flatten(config), flatten(preset)
    return {key: value for key, value in sorted(ran.items())
            if key in base and key not in _NOT_DIFFERENCES and base[key] is not None
            and json.dumps(value, sort_keys=True) != json.dumps(base[key], sort_keys=True)}


def describe_changes(changed: dict[str, Any]) -> list[str]:
    """Label parts for :func:`config_changes`: ``["steps=300"]``, or ``["custom: 5 fields"]``.

    A field goes by its last name unless two changed fields share it.

    Example:
        >>> describe_changes({"train.steps": 300, "model.max_length": 64,
        ...                   "data.options.max_length": 64})
        ['custom: 3 fields']
        >>> describe_changes({"model.max_length": 64, "data.options.max_length": 64})
        ['model.max_length=64', 'data.options.max_length=64']
    """
    if not changed:
        return []
    if len(changed) > _SHOWN:
        return [f"custom: {len(changed)} fields"]
    last = [key.rsplit(".", 1)[-1] for key in changed]
    return [f"{key if last.count(short) > 1 else short}={_text(value)}"
            for (key, value), short in zip(changed.items(), last)]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def config_file(task: str) -> pathlib.Path | None:
    """The task's shipped config file, ``spectral_jax/lra/configs/lra/<task>.py``, or None.

    Example:
        >>> config_file("listops").name
        'listops.py'
    """
    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "lra" / f"{task}.py"
    return path if path.is_file() else None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"a.b": value}``.

    Example:
        >>> flatten({"train": {"steps": 5}, "seed": 0})
        {'train.steps': 5, 'seed': 0}
    """
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}."))
    return out


def _preset(task: str, protocol: str, method: str, spt: bool) -> dict[str, Any] | None:
    path = config_file(task)
    return None if path is None else _recorded_preset(str(path), protocol, method, spt)


@functools.cache
def _recorded_preset(path: str, protocol: str, method: str,
                     spt: bool) -> dict[str, Any] | None:
    """The preset's config as a run records it, or None when the file cannot build it."""
    from spectral_jax.lra.train import pretrain
    from spectral_jax.lra.train.overrides import load_config
    from spectral_jax.lra.train.run import recorded_config

    try:
        config = recorded_config(load_config(
            f"{path}:protocol={protocol},attention={method}{',spt' if spt else ''}"))
    except (UsageError, FileNotFoundError):  # a preset or method the file does not know
        return None
    if config.model.vocab_size is not None:  # the run records the vocabulary it trained
        config.model.vocab_size += pretrain.added_token_ids(config)
    return config.to_dict()
