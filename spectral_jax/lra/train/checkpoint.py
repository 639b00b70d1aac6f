"""Orbax checkpoints of a training run: the last N and the best by validation accuracy."""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from spectral_jax import UsageError
from spectral_jax.lra.train.report import jsonable

# A checkpoint saved on a signal between two logged steps also stores the unlogged steps'
# metrics under this key, so the resumed run logs the same window as an uninterrupted one.
UNLOGGED_WINDOW = "unlogged_window"


def host_window(window: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The unlogged steps' metrics as JSON (float32 and bool values are exact as floats)."""
    return [{k: float(v) for k, v in m.items()} for m in jax.device_get(window)]


def restore_window(saved: list[dict[str, float]] | None) -> list[dict[str, Any]]:
    """:func:`host_window` undone: the same float32 (``finite``: bool) scalars."""
    return [{k: np.bool_(v) if k == "finite" else np.float32(v) for k, v in m.items()}
            for m in saved or ()]

BEST_METRIC = "val_accuracy"
# The metric of a step saved without a validation (on a stop signal): below any accuracy, so
# it is never the best, and it ages out like any other recent checkpoint.
UNVALIDATED = -1.0
# What a finished save leaves in a step directory: orbax's step metadata, then per item its
# own metadata file (written last by the handlers).
REQUIRED_FILES = ("_CHECKPOINT_METADATA", os.path.join("state", "_METADATA"),
                  os.path.join("meta", "metadata"))


class Checkpointer:
    """Saves ``(state, meta)`` at evaluation steps, and at a step stopped by a signal, under
    ``directory``.

    Keeps the ``keep`` most recent checkpoints plus the one with the highest validation accuracy
    (ties go to the later step, as orbax's ``BestN`` ranks them). Each step stores its
    accuracy beside it (``metrics/``), so a resumed run still knows which one is best; a step
    saved without one (by an older version) is never deleted. ``state`` is an ``nnx.State``
    (model and optimizer, without RNG streams); ``meta`` a small JSON dict (best so far,
    wall time). Saves are asynchronous; :meth:`close` waits for them.

    A step directory that lacks part of a finished save (a copy cut short, a file deleted)
    is not a checkpoint: on opening, each such directory is renamed to
    ``<step>.incomplete`` with a warning naming it, so resuming starts from the last
    complete checkpoint and a later save of that step does not collide with it.

    Args:
        directory: absolute or relative path; created if missing.
        keep: how many recent checkpoints to keep (>= 1).

    Raises:
        spectral_jax.UsageError: if ``keep`` < 1.

    Example:
        >>> import tempfile
        >>> ckpt = Checkpointer(tempfile.mkdtemp(), keep=1)
        >>> ckpt.latest_step() is None
        True
        >>> ckpt.close()
    """

    def __init__(self, directory: str, *, keep: int) -> None:
        if not isinstance(keep, int) or keep < 1:
            raise UsageError(f"train.keep_checkpoints={keep!r} must be an int >= 1")
        directory = os.path.abspath(directory)
        _set_aside_incomplete(directory)
        metric = lambda metrics: metrics[BEST_METRIC]  # noqa: E731
        policy = ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(n=keep),
            # A checkpoint whose metric is unknown (saved before metrics were written to
            # disk) is kept: it may be the best, and only a fresh process cannot tell.
            ocp.checkpoint_managers.BestN(
                get_metric_fn=metric, reverse=False, n=1, keep_checkpoints_without_metrics=True,
            ),
        ])
        self._manager = ocp.CheckpointManager(
            directory,
            # Without ``best_fn`` orbax keeps the metrics in memory only, so a resumed run
            # saw none and its first save deleted the best checkpoint.
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy, best_fn=metric, best_mode="max", create=True),
            item_names=("state", "meta"),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: nnx.State, meta: dict[str, Any],
             val_accuracy: float | None) -> None:
        """Starts an asynchronous save of ``state`` and ``meta`` at ``step``.

        ``val_accuracy`` None: a step saved between validations, ranked below every
        validated one (:data:`UNVALIDATED`).
        """
        if val_accuracy is None:
            val_accuracy = UNVALIDATED
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(nnx.to_pure_dict(state)),
                meta=ocp.args.JsonSave({k: jsonable(v) for k, v in meta.items()}),
            ),
            metrics={BEST_METRIC: float(val_accuracy)},
        )

    def restore(self, step: int, target: nnx.State) -> tuple[nnx.State, dict[str, Any]]:
        """Restores the checkpoint at ``step`` into the structure and shardings of ``target``.

        Raises:
            FileNotFoundError: if no checkpoint exists at ``step``.
        """
        if step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint at step {step} in {self._manager.directory}; "
                f"available steps: {self.all_steps()}"
            )
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(target))
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        state = jax.tree.map(lambda x: x, target)  # a copy; replace_by_pure_dict mutates
        nnx.replace_by_pure_dict(state, restored.state)
        return state, dict(restored.meta)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _set_aside_incomplete(directory: str) -> None:
    """Renames step directories missing any of ``REQUIRED_FILES``, warning for each.

    Every process reaches the closing barrier, whether or not it finds ``directory``: one
    process may look before another has created it, and a barrier skipped by one process
    meets the next barrier of the others.
    """
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        path = os.path.join(directory, name)
        if not (name.isdigit() and os.path.isdir(path)):
            continue
        missing = [f for f in REQUIRED_FILES if not os.path.isfile(os.path.join(path, f))]
        if not missing:
            continue
        aside, copy = f"{path}.incomplete", 1
        while os.path.exists(aside):
            aside, copy = f"{path}.incomplete{copy}", copy + 1
        warnings.warn(
            f"checkpoint directory {path} is incomplete (missing {', '.join(missing)}): "
            f"skipped and moved to {aside}; resuming from the last complete checkpoint.",
            stacklevel=3)
        if jax.process_index() == 0:
            os.rename(path, aside)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("incomplete checkpoints set aside")
