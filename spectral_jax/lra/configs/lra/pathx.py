"""Path-X (LRA): Pathfinder at 128x128 = 16384 pixel tokens (2 classes).

    spectral-jax train --config lra/pathx:attention=skyformer \\
        --config.data.dir=/data/lra_release/pathfinder128 --workdir runs/pathx_sky

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). ``data.dir`` holds
the release's ``pathfinder128`` folder.

- ``lra``: ``image/configs/pathfinder128/transformer_base.py`` (1 layer, width 32, 2 heads,
  qkv 16, MLP 32, learned positions, MEAN, AdamW b2=0.98 eps=1e-9 wd=0, base lr 1e-3, 2500
  warmup steps, cosine, global-norm clip 1.0, 500000 steps of 64).
- ``small``: the Nystromformer/Skyformer model (2 layers, width 64, MEAN, lr 1e-4, linear);
  those papers do not run Path-X, so the schedule (LRA's steps, batch 64) is ours.
- ``quick``: 2 layers, 100 steps: a CPU smoke run, not a result.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

_SMALL_MODEL = {**config_lib.SMALL_MODEL, "vocab_size": 256}
_DATA = {"dir": "data/lra_release",
         "options": {"resolution": 128, "difficulty": "curv_contour_length_14"}}

LRA = {
    "data": _DATA,
    "model": {
        "vocab_size": 256, "max_length": 16384, "num_layers": 1, "embed_dim": 32,
        "num_heads": 2, "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.1,
        "attention_dropout_rate": 0.1, "pooling": "mean", "positional": "learned",
    },
    "train": {
        "steps": 500000, "batch_size": 64, "eval_every": 2500, "eval_steps": 312,
        "log_every": 500, "grad_clip_norm": 1.0,
        "optimizer": {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.0},
        "schedule": {"name": "cosine", "warmup_steps": 2500},
    },
}

SMALL = {
    "data": _DATA,
    "model": {**_SMALL_MODEL, "max_length": 16384},
    "train": {
        "steps": 500000, "batch_size": 64, "eval_every": 2500, "eval_steps": 312,
        "log_every": 500, "grad_clip_norm": 1.0,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 2500},
    },
}

QUICK = {
    "data": _DATA,
    "model": {**_SMALL_MODEL, "max_length": 16384, "dropout_rate": 0.0},
    "train": {
        "steps": 100, "batch_size": 8, "eval_every": 50, "eval_steps": 10, "log_every": 25,
        "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 10},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Path-X config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("pathx", arg, PRESETS)
