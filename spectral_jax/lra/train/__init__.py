"""LRA training: configs, the run lifecycle, the loop, checkpoints, sweeps and tables.

``train_and_evaluate(config, workdir)`` is the entry point, as in the Flax examples; configs
are ``lra/<task>`` in ``spectral_jax/lra/configs`` (see
:mod:`spectral_jax.lra.train.config_lib`), loaded with
``--config.FIELD=VALUE`` overrides by :func:`spectral_jax.lra.train.overrides.load_config`. A
run is opened by ``open_for_training`` or ``restore_for_evaluation``
(:mod:`spectral_jax.lra.train.run`). The names are imported lazily so that
``spectral-jax --help`` does not load JAX, Flax and orbax.

One training step, top to bottom: ``spectral-jax train`` (:mod:`spectral_jax.lra.cli.train`)
calls :func:`~spectral_jax.lra.train.loop.train_and_evaluate` (``loop.py``), which opens the
run (``run.py``: data, mesh, model and optimizer, checkpoints) and calls the jitted step of
``steps.py``; the step runs :class:`spectral_jax.nn.SequenceClassifier`, whose attention layers
call a :mod:`spectral_jax.attention` function. Beside them: ``report.py`` (metrics log,
console, cost figures), ``workdir.py`` (the run's files, extending a run), ``checkpoint.py``,
``distributed.py`` (mesh and batch sharding) and ``interrupt.py`` (SIGINT and SIGTERM).
"""

from __future__ import annotations

from spectral_jax.lra import require

require()

import importlib  # noqa: E402  (after the check, so a missing extra is named first)
from typing import Any  # noqa: E402

_EXPORTS = {
    "TrainingDiverged": "interrupt",
    "TrainingInterrupted": "interrupt",
    "evaluate": "loop",
    "evaluate_checkpoint": "loop",
    "train_and_evaluate": "loop",
    "Run": "run",
    "open_for_training": "run",
    "restore_for_evaluation": "run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"spectral_jax.lra.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'spectral_jax.lra.train' has no attribute {name!r}")
