"""LRA training: configs, the loop, checkpoints, metrics and the ``train``/``eval``/``table`` CLI.

``train_and_evaluate(config, workdir)`` is the entry point, as in the Flax examples; configs
come from ``configs/lra/*.py`` (see :mod:`spectral_jax.train.config_lib`). The loop's names are
imported lazily so that ``spectral-jax --help`` does not load JAX, Flax and orbax.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TrainingDiverged", "evaluate", "evaluate_checkpoint", "train_and_evaluate"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("spectral_jax.train.loop"), name)
    raise AttributeError(f"module 'spectral_jax.train' has no attribute {name!r}")
