"""Text (LRA): byte-level IMDB sentiment classification (2 classes).

    spectral-jax train --config lra/text:attention=nystrom,protocol=small \\
        --config.data.dir=/data/imdb --workdir runs/text_nys

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). ``data.dir`` holds
``aclImdb/`` (https://ai.stanford.edu/~amaas/data/sentiment/); validation is a seeded 10% slice
of train, not LRA's reuse of the test split.

- ``lra``: ``text_classification/configs/base_tc_config.py`` (1000 bytes, 4 layers, width 256,
  AdamW b2=0.98 eps=1e-9 wd=0.1, base lr 0.05, 8000 warmup steps, rsqrt, CLS, 20000 steps).
- ``small``: Nystromformer/Skyformer (4000 bytes, 2 layers, width 64, MEAN, lr 1e-4, 8000 warmup
  steps, linear decay, 20000 steps).
- ``quick``: 512 bytes, 2 layers, 600 steps: a CPU smoke run, not a result.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

_SMALL_MODEL = {**config_lib.SMALL_MODEL, "vocab_size": 257}

LRA = {
    "data": {"dir": "data/imdb", "options": {"max_length": 1000}},
    "model": {
        "vocab_size": 257, "max_length": 1000, "num_layers": 4, "embed_dim": 256,
        "num_heads": 4, "qkv_dim": 256, "mlp_dim": 1024, "dropout_rate": 0.1,
        "attention_dropout_rate": 0.1, "pooling": "cls", "positional": "sinusoidal",
    },
    "train": {
        "steps": 20000, "batch_size": 32, "eval_every": 100, "log_every": 100,
        "optimizer": {"learning_rate": 0.05, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.1},
        "schedule": {"name": "rsqrt", "warmup_steps": 8000},
    },
}

SMALL = {
    "data": {"dir": "data/imdb", "options": {"max_length": 4000}},
    "model": {**_SMALL_MODEL, "max_length": 4000},
    "train": {
        "steps": 20000, "batch_size": 32, "eval_every": 500, "eval_steps": 781, "log_every": 100,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 8000},
    },
}

QUICK = {
    "data": {"dir": "data/imdb", "options": {"max_length": 512}},
    "model": {**_SMALL_MODEL, "max_length": 512, "dropout_rate": 0.0},
    "train": {
        "steps": 600, "batch_size": 32, "eval_every": 200, "log_every": 50, "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 60},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Text config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("text", arg, PRESETS)
