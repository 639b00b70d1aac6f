"""Retrieval (LRA): do two AAN papers cite each other? Byte-level dual encoder (2 classes).

    spectral-jax train --config lra/retrieval:attention=skyformer,protocol=small \\
        --config.data.dir=/data/lra_release/tsv_data --workdir runs/retrieval_sky

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). ``data.dir`` holds
``new_aan_pairs.{train,eval,test}.tsv`` from ``lra_release/tsv_data``.

- ``lra``: ``matching/configs/base_match_config.py`` (4000 bytes per document, 4 layers,
  width 128, shared encoder, ``[u, v]`` interaction, AdamW b2=0.98 eps=1e-9 wd=0.1, base lr
  0.05, 8000 warmup steps (never reached in 5000 steps, as in LRA), rsqrt, CLS = first byte).
- ``small``: Nystromformer/Skyformer (2 layers, width 64, MEAN, ``[u, v, u*v, u-v]``,
  lr 1e-4, 800 warmup steps, linear decay, 30000 steps).
- ``quick``: 256 bytes per document, 300 steps: a CPU smoke run, not a result.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

_SMALL_MODEL = {**config_lib.SMALL_MODEL, "vocab_size": 257, "interaction": "nli"}

LRA = {
    "data": {"dir": "data/lra_release/tsv_data", "options": {"max_length": 4000}},
    "model": {
        "vocab_size": 257, "max_length": 4000, "num_layers": 4, "embed_dim": 128,
        "num_heads": 4, "qkv_dim": 128, "mlp_dim": 512, "dropout_rate": 0.1,
        "attention_dropout_rate": 0.1, "pooling": "cls", "positional": "sinusoidal",
        "interaction": "concat",
    },
    "train": {
        "steps": 5000, "batch_size": 32, "eval_every": 100, "log_every": 100,
        "optimizer": {"learning_rate": 0.05, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.1},
        "schedule": {"name": "rsqrt", "warmup_steps": 8000},
    },
}

SMALL = {
    "data": {"dir": "data/lra_release/tsv_data", "options": {"max_length": 4000}},
    "model": {**_SMALL_MODEL, "max_length": 4000},
    "train": {
        "steps": 30000, "batch_size": 32, "eval_every": 300, "eval_steps": 565, "log_every": 100,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 800},
    },
}

QUICK = {
    "data": {"dir": "data/lra_release/tsv_data", "options": {"max_length": 256}},
    "model": {**_SMALL_MODEL, "max_length": 256, "dropout_rate": 0.0},
    "train": {
        "steps": 300, "batch_size": 32, "eval_every": 100, "log_every": 50, "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 30},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Retrieval config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("retrieval", arg, PRESETS)
