"""A run's workdir: the files it holds, the config it was started with, and extending it.

A run's workdir holds ``config.json`` (written once, when the run starts), orbax checkpoints,
``metrics.jsonl`` (and TensorBoard events), ``results.json`` when it has finished and
``extensions.json`` when it was extended. :func:`check_workdir` refuses to start a run in a
workdir holding another config; :func:`write_workdir` claims it.

**Extending** continues training in the workdir to a larger ``train.steps``.

``spectral-jax train ... --config.train.steps=NEW --extend`` (``train_and_evaluate(...,
extend=True)``) accepts a workdir whose config differs from the given one in ``train.steps``
alone, with ``NEW`` at least the recorded value. It resumes from the run's last checkpoint
and trains to ``NEW``; ``config.json`` then records ``NEW``, the previous ``results.json`` is
removed (the run is unfinished again; its headline figures are kept in the extension's
entry), ``extensions.json`` lists every extension and ``metrics.jsonl`` gets one record with
``"split": "extend"`` at the step the extension starts from. Rerunning the same command
after an interruption resumes the extension; it is not recorded twice.

**The schedule past the original end is re-evaluated for the new total**: every step after
the extension point ``s`` uses ``make_schedule(config with train.steps=NEW)(s)``, the
schedule a run started with ``NEW`` steps would use at ``s``. So ``rsqrt`` and ``constant``,
which do not depend on ``train.steps``, continue exactly as that run would (an extended run
equals it step for step); ``cosine`` (one cycle over ``train.steps`` unless
``train.schedule.steps_per_cycle`` is set) and ``linear`` decay stretch to reach their end at
``NEW``, so the rate rises at the first new step from the old schedule's final value (0 for
``linear``) to the stretched curve's value there, as in a warm restart, and then decays to
the new end. The steps already trained keep the rates they were trained with.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import ml_collections

from spectral_jax import UsageError, _checks

EXTENSIONS_FILE = "extensions.json"
CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"
# Files a run owns in its workdir; --overwrite removes exactly these.
_RUN_FILES = (CONFIG_FILE, RESULTS_FILE, CHECKPOINT_DIR, "metrics.jsonl", "tensorboard",
              EXTENSIONS_FILE, "pretrain_checkpoints", "pretrain.json")
# results.json figures an extension keeps from the run it continues.
_KEPT_RESULTS = ("steps", "best_step", "best_val_accuracy", "test_accuracy",
                 "final_test_accuracy", "wall_time_s")


def check_extension(workdir: str, config: ml_collections.ConfigDict) -> int:
    """The recorded ``train.steps`` of the run in ``workdir`` that ``config`` may extend.

    Raises:
        FileNotFoundError: no run in ``workdir``.
        spectral_jax.UsageError: ``config.train.steps`` below the recorded value, or another
          field differs.

    Example:
        >>> import tempfile
        >>> check_extension(tempfile.mkdtemp(), None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: extend: no run to extend in workdir='...' (config.json is missing)...
    """
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"extend: no run to extend in workdir={workdir!r} ({CONFIG_FILE} "
                                "is missing); drop --extend to start one")
    with open(path) as f:
        from_steps = json.load(f)["train"]["steps"]
    steps = config.train.steps
    if steps < from_steps:
        raise UsageError(_checks.message(
            "extend", "train.steps", f">= {from_steps}, the train.steps of the run in "
            f"workdir={workdir!r} (an extension adds steps)", steps))
    same_steps = ml_collections.ConfigDict(config.to_dict())
    same_steps.train.steps = from_steps
    why = config_mismatch(workdir, same_steps)
    if why is not None:
        raise UsageError(
            f"extend: workdir={workdir!r} holds a run whose config differs in more than "
            f"train.steps ({why}); an extension changes train.steps alone")
    return int(from_steps)


def record_extension(workdir: str, from_steps: int, to_steps: int,
                     at_step: int) -> dict[str, Any] | None:
    """Records extending the run in ``workdir`` from ``from_steps`` to ``to_steps``.

    Appends the entry to ``extensions.json``, removes ``results.json`` (keeping its headline
    figures in the entry) and sets ``train.steps`` in ``config.json``, in that order, so a
    process killed in between leaves the extension recorded. Call on process 0 only.

    Args:
        workdir: the run directory (checked by :func:`check_extension`).
        from_steps: the recorded ``train.steps``.
        to_steps: the new ``train.steps``.
        at_step: the checkpoint the extension resumes from (0 for none).

    Returns:
        The entry ``{"from_steps", "to_steps", "at_step", "results"}`` (``results`` None for
        an unfinished run), or None when ``to_steps == from_steps`` (a plain resume).
    """
    if to_steps == from_steps:
        return None
    results_path = os.path.join(workdir, RESULTS_FILE)
    results = None
    if os.path.exists(results_path):
        with open(results_path) as f:
            finished = json.load(f)
        results = {key: finished.get(key) for key in _KEPT_RESULTS}
    entry = {"from_steps": int(from_steps), "to_steps": int(to_steps), "at_step": int(at_step),
             "results": results}
    _write_json(os.path.join(workdir, EXTENSIONS_FILE), [*read_extensions(workdir), entry])
    if os.path.exists(results_path):
        os.remove(results_path)
    config_path = os.path.join(workdir, CONFIG_FILE)
    with open(config_path) as f:
        recorded = json.load(f)
    # Edited rather than rewritten, so a relative data.dir stays as it was recorded.
    recorded["train"]["steps"] = int(to_steps)
    _write_json(config_path, recorded, sort_keys=True)
    return entry


def read_extensions(workdir: str) -> list[dict[str, Any]]:
    """The extensions of the run in ``workdir``, oldest first (``[]`` for none).

    Example:
        >>> import tempfile
        >>> read_extensions(tempfile.mkdtemp())
        []
    """
    path = os.path.join(workdir, EXTENSIONS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, value: Any, **kwargs: Any) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(value, f, indent=2, **kwargs)
    os.replace(temporary, path)


def read_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a run in ``workdir`` was trained with; a train field added after the run
    was recorded reads as the value the run had (``config_lib.RECORDED_DEFAULTS``).

    Raises:
        FileNotFoundError: no run in ``workdir``.
    """
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no run in workdir={workdir!r} ({CONFIG_FILE} is missing)")
    with open(path) as f:
        return ml_collections.ConfigDict(_with_recorded_defaults(json.load(f)))


def _with_recorded_defaults(recorded: dict[str, Any]) -> dict[str, Any]:
    """``recorded`` (a run's config as JSON) with each train field added after the run was
    recorded set to the value the run had (``config_lib.RECORDED_DEFAULTS``)."""
    if isinstance(recorded.get("train"), dict):
        from spectral_jax.lra.train.config_lib import RECORDED_DEFAULTS

        recorded["train"] = {**RECORDED_DEFAULTS, **recorded["train"]}
    return recorded


def config_mismatch(workdir: str, config: ml_collections.ConfigDict) -> str | None:
    """What differs between ``config`` and the run already in ``workdir`` (None: same or none).

    Both ``data.dir`` values are resolved (a relative one against the current directory)
    before the comparison, so a run committed with a relative ``data.dir`` resumes from the
    folder that path names, and ``data`` or ``./data`` or its absolute path are the same.
    ``train.bucket_window`` counts only where length buckets are on in either config.
    """
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        existing = _with_recorded_defaults(json.load(f))
    wanted = json.loads(config.to_json(sort_keys=True))
    both = (existing, wanted)
    for recorded in both:
        if isinstance(recorded.get("data"), dict) and isinstance(recorded["data"].get("dir"), str):
            recorded["data"]["dir"] = os.path.realpath(recorded["data"]["dir"])
    trains = [r.get("train") for r in both]
    if all(isinstance(t, dict) and not t.get("bucket_multiple") for t in trains):
        for t in trains:
            t.pop("bucket_window", None)  # unused while length buckets are off
    return None if existing == wanted else _diff(existing, wanted)


def check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
    why = config_mismatch(workdir, config)
    if why is not None:
        extend = ""
        try:
            check_extension(workdir, config)
            extend = f", or --extend to continue it to train.steps={config.train.steps}"
        except UsageError:
            pass
        raise UsageError(
            f"workdir={workdir!r} holds a run with a different config "
            f"({why}); use another --workdir, or --overwrite to delete that run{extend}"
        )


def write_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
    if overwrite:
        for name in _RUN_FILES:
            target = os.path.join(workdir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.remove(target)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, CONFIG_FILE)
    if os.path.exists(path):
        # A resumed run keeps its config.json as written (``check_workdir`` found it equal),
        # so a committed run's relative data.dir survives resuming it.
        return
    with open(path, "w") as f:
        f.write(config.to_json(sort_keys=True, indent=2))


def _diff(old: Any, new: Any, prefix: str = "") -> str:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key, "<missing>") != new.get(key, "<missing>"):
                return _diff(old.get(key, "<missing>"), new.get(key, "<missing>"),
                             f"{prefix}{key}.")
    return f"{prefix.rstrip('.')}: {old!r} there, {new!r} now"
