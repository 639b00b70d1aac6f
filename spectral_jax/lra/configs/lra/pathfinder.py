"""Pathfinder (LRA): are the two dots of a 32x32 image joined by a dashed path? (2 classes).

    spectral-jax train --config lra/pathfinder:attention=nystrom,protocol=small \\
        --config.data.dir=/data/lra_release/pathfinder32 --workdir runs/pathfinder_nys

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). ``data.dir`` holds
the release's ``pathfinder32`` folder (``curv_contour_length_14``: the hard split).

- ``lra``: ``image/configs/pathfinder32/transformer_base.py`` (4 layers, width 32, 4 heads,
  qkv 16, MLP 32, dropout 0.2 / attention 0.1, sinusoidal, MEAN, AdamW b2=0.98 eps=1e-9 wd=0,
  base lr 1e-3, 312 warmup steps, cosine, 62400 steps of 512).
- ``small``: Nystromformer/Skyformer (2 layers, width 64, MEAN, lr 1e-4, linear, 62400 steps of
  256).
- ``quick``: 2 layers, 300 steps: a CPU smoke run, not a result.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

_SMALL_MODEL = {**config_lib.SMALL_MODEL, "vocab_size": 256}
_DATA = {"dir": "data/lra_release",
         "options": {"resolution": 32, "difficulty": "curv_contour_length_14"}}

LRA = {
    "data": _DATA,
    "model": {
        "vocab_size": 256, "max_length": 1024, "num_layers": 4, "embed_dim": 32,
        "num_heads": 4, "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2,
        "attention_dropout_rate": 0.1, "pooling": "mean", "positional": "sinusoidal",
    },
    "train": {
        "steps": 62400, "batch_size": 512, "eval_every": 312, "eval_steps": 39,
        "log_every": 312,
        "optimizer": {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.0},
        "schedule": {"name": "cosine", "warmup_steps": 312},
    },
}

SMALL = {
    "data": _DATA,
    "model": {**_SMALL_MODEL, "max_length": 1024},
    "train": {
        "steps": 62400, "batch_size": 256, "eval_every": 312, "eval_steps": 312,
        "log_every": 312,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 312},
    },
}

QUICK = {
    "data": _DATA,
    "model": {**_SMALL_MODEL, "max_length": 1024, "dropout_rate": 0.0},
    "train": {
        "steps": 300, "batch_size": 32, "eval_every": 100, "eval_steps": 20, "log_every": 50,
        "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 30},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Pathfinder config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("pathfinder", arg, PRESETS)
