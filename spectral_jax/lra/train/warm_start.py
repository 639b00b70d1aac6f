"""Starting a run from another run's trained model (``train.init_from``): a curriculum's stage.

``train.init_from`` names a finished or running run directory. A new run (no checkpoint of
its own yet) starts from that run's best checkpoint: every model parameter of the same path
and shape is copied; a learned position table of another length keeps its first rows
(those of the positions both runs have) and the new run's initialisation for the rest. The
optimizer state and the step count start fresh, as the new run's schedule does. A run that
resumes from its own checkpoint ignores ``init_from``.

The use the field has for it is a short-to-long curriculum: train at 128 tokens, then at the
LRA length from that model (``benchmarks/lra_listops/README.md``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx, traverse_util

from spectral_jax import UsageError, _checks

# The parameter whose leading axis is the sequence position (nn.TokenEmbedding).
POSITION_TABLE = "position_table"


def enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether ``config`` starts from another run (``train.init_from`` set)."""
    return bool(config.train.get("init_from"))


def check_config(config: ml_collections.ConfigDict) -> None:
    """Checks ``train.init_from`` before anything is loaded.

    Raises:
        spectral_jax.UsageError: not a string, or set together with a pretraining stage
          (``train.pretrain_steps > 0``), which also decides where the encoder starts.
    """
    source = config.train.get("init_from")
    if source is None:
        return
    if not isinstance(source, str):
        raise UsageError(_checks.message("config", "train.init_from", "a run directory",
                                         source))
    if int(config.train.get("pretrain_steps", 0) or 0) > 0:
        raise UsageError(
            f"train.init_from={source!r} with train.pretrain_steps="
            f"{config.train.pretrain_steps}: both decide where the encoder starts; set one")


def check_source(source: str, checkpoint_dir: str, workdir: str, *,
                 starts_fresh: bool) -> None:
    """Checks the run that ``train.init_from`` names, before ``workdir`` is claimed.

    Args:
      source: the source run directory.
      checkpoint_dir: the name of a run's checkpoint folder.
      workdir: the new run's directory.
      starts_fresh: the new run has no checkpoint of its own (or ``--overwrite`` deletes
        it): only then is the source read, and only then is it checked.

    Raises:
        spectral_jax.UsageError: ``source`` is ``workdir`` itself (``--overwrite`` would
          delete it before it is read), or holds no checkpoint.
    """
    if not starts_fresh:
        return
    if os.path.realpath(source) == os.path.realpath(workdir):
        raise UsageError(
            f"train.init_from={source!r} is the run's own workdir: a new run cannot start "
            "from itself (--overwrite would delete it first); copy it elsewhere, or resume it")
    checkpoints = os.path.join(source, checkpoint_dir)
    if not os.path.isdir(checkpoints) or not os.listdir(checkpoints):
        raise UsageError(
            f"train.init_from={source!r} holds no checkpoint (no {checkpoints}): it must name "
            "the workdir of a run that has saved at least one")


def copy_model(target: nnx.State, source: nnx.State) -> tuple[nnx.State, dict[str, Any]]:
    """``target`` (a ``(model, optimizer)`` state) with ``source``'s model parameters.

    Returns:
      ``(state, report)``: the new state, and ``{"copied", "resized", "kept"}``, the lists of
      parameter paths copied whole, copied in part (position tables) and left as initialised
      (not in the source).

    Raises:
        spectral_jax.UsageError: a parameter in both with shapes that cannot be matched or
          dtypes that differ (naming it and both), or source parameters this model lacks.
    """
    pure = nnx.to_pure_dict(target)
    new = traverse_util.flatten_dict(pure[0])
    old = traverse_util.flatten_dict(nnx.to_pure_dict(source)[0])
    report: dict[str, list[str]] = {"copied": [], "resized": [], "kept": []}
    dropped = sorted("/".join(map(str, p)) for p in set(old) - set(new))
    if dropped:
        # E.g. a CLS token in one model only, which also shifts every position by one.
        raise UsageError(
            f"train.init_from: the source run has parameters this model lacks: {dropped}; "
            "build the same model (method, pooling, sizes) at the new length")
    for path, value in new.items():
        name = "/".join(map(str, path))
        if path not in old:
            report["kept"].append(name)
            continue
        given = old[path]
        if given.dtype != value.dtype:
            raise UsageError(
                f"train.init_from: parameter {name} is {given.dtype} in the source run and "
                f"{value.dtype} here; use the source run's model.param_dtype")
        if given.shape == value.shape:
            new[path] = jax.device_put(np.asarray(given), value.sharding)
            report["copied"].append(name)
        elif path[-1] == POSITION_TABLE and given.shape[1:] == value.shape[1:]:
            rows = min(given.shape[0], value.shape[0])
            merged = np.asarray(value).copy()
            merged[:rows] = np.asarray(given)[:rows]
            new[path] = jax.device_put(merged, value.sharding)
            report["resized"].append(name)
        else:
            raise UsageError(
                f"train.init_from: parameter {name} has shape {tuple(given.shape)} in the "
                f"source run and {tuple(value.shape)} here; only {POSITION_TABLE} may differ "
                "(in its length). Use the source run's model sizes")
    pure[0] = traverse_util.unflatten_dict(new)
    state = jax.tree.map(lambda x: x, target)  # a copy: replace_by_pure_dict mutates
    nnx.replace_by_pure_dict(state, pure)
    return state, report


def warm_start(run: Any, source: str, source_state: nnx.State, step: int) -> nnx.State:
    """``run``'s initial state with the model of ``source_state``, the checkpoint at ``step`` of
    the run in ``source`` (``run_lib.restore_for_evaluation(source, "best")`` restores it).

    Raises:
        spectral_jax.UsageError: parameters whose shapes differ (see :func:`copy_model`).
    """
    with jax.set_mesh(run.mesh):
        new_state, report = copy_model(run.setup.state, source_state)
    if run.is_main:
        print(f"Starting from the model of {source} (step {step}): "
              f"{len(report['copied'])} parameters copied, "
              f"{len(report['resized'])} resized ({', '.join(report['resized']) or 'none'}), "
              f"{len(report['kept'])} new ({', '.join(report['kept']) or 'none'}).", flush=True)
    return new_state
