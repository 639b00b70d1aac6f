"""Orbax checkpoints of a training run: the last N and the best by validation accuracy."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from spectral_jax.train.writers import _jsonable

BEST_METRIC = "val_accuracy"


class Checkpointer:
    """Saves ``(state, meta)`` at evaluation steps under ``directory``.

    Keeps the ``keep`` most recent checkpoints plus the one with the highest validation accuracy
    (ties go to the later step, as orbax's ``BestN`` ranks them). ``state`` is an ``nnx.State``
    (model and optimizer, without RNG streams); ``meta`` a small JSON dict (best so far,
    wall time). Saves are asynchronous; :meth:`close` waits for them.

    Args:
        directory: absolute or relative path; created if missing.
        keep: how many recent checkpoints to keep (>= 1).

    Raises:
        ValueError: if ``keep`` < 1.

    Example:
        >>> import tempfile
        >>> ckpt = Checkpointer(tempfile.mkdtemp(), keep=1)
        >>> ckpt.latest_step() is None
        True
        >>> ckpt.close()
    """

    def __init__(self, directory: str, *, keep: int) -> None:
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"train.keep_checkpoints={keep!r} must be an int >= 1")
        policy = ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(n=keep),
            ocp.checkpoint_managers.BestN(
                get_metric_fn=lambda metrics: metrics[BEST_METRIC], reverse=False, n=1,
                keep_checkpoints_without_metrics=False,
            ),
        ])
        self._manager = ocp.CheckpointManager(
            os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(preservation_policy=policy, create=True),
            item_names=("state", "meta"),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: nnx.State, meta: dict[str, Any], val_accuracy: float) -> None:
        """Starts an asynchronous save of ``state`` and ``meta`` at ``step``."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(nnx.to_pure_dict(state)),
                meta=ocp.args.JsonSave({k: _jsonable(v) for k, v in meta.items()}),
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
