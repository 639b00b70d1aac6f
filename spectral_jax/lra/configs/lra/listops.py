"""ListOps (LRA): 10-way classification of nested MAX/MIN/MED/SUM_MOD expressions.

    spectral-jax train --config lra/listops:quick --workdir runs/listops_quick
    spectral-jax train --config lra/listops:attention=nystrom,protocol=small \\
        --config.data.dir=/data/lra_release/listops-1000 --workdir runs/listops_nys

Arguments after ``:`` (comma separated): ``attention=<registry name>`` (default
``spectral_shift``), ``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). Any field can be
overridden with ``--config.<path>=<value>``; ``--config.model.attention=X`` and
``--config.model.max_length=N`` re-run ``get_config`` with ``attention=X`` / ``max_length=N``, so
the fields that follow from them are computed here, as for ``:attention=X``.

- ``lra``: ``listops/configs/base_listops_config.py`` of google-research/long-range-arena
  (4 layers, width 512, AdamW b2=0.98 eps=1e-9 wd=0.1, base lr 0.05 with 1000 warmup steps
  and rsqrt decay, CLS pooling, 5000 steps, batch 32).
- ``small``: the Nystromformer/Skyformer comparison model (mlpen/Nystromformer ``LRA/code``:
  2 layers, width 64, 2 heads of 32, MLP 128, MEAN pooling, learned positions, AdamW 1e-4
  with 1000 warmup steps and linear decay, 5000 steps).
- ``quick``: the CPU preset of the README's main command: ListOps generated with LRA's
  algorithm at 20-128 tokens and depth <= 6 (written to ``data/listops_quick`` if absent),
  a 2-layer width-64 model, 3500 steps of batch 32 (the README gives its measured time and
  accuracy).
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

LRA = {
    "data": {"dir": "data/lra_release/listops-1000", "options": {"max_length": 2000}},
    "model": {
        "vocab_size": 17, "max_length": 2000, "num_layers": 4, "embed_dim": 512,
        "num_heads": 8, "qkv_dim": 512, "mlp_dim": 1024, "dropout_rate": 0.1,
        "attention_dropout_rate": 0.1, "pooling": "cls", "positional": "sinusoidal",
    },
    "train": {
        "steps": 5000, "batch_size": 32, "eval_every": 50, "log_every": 50,
        "optimizer": {"learning_rate": 0.05, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.1},
        "schedule": {"name": "rsqrt", "warmup_steps": 1000},
    },
}

SMALL = {
    "data": {"dir": "data/lra_release/listops-1000", "options": {"max_length": 2000}},
    "model": {**config_lib.SMALL_MODEL, "vocab_size": 17, "max_length": 2000},
    "train": {
        "steps": 5000, "batch_size": 32, "eval_every": 50, "eval_steps": 62, "log_every": 50,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 1000},
    },
}

QUICK = {
    "data": {
        "dir": "data/listops_quick",
        "options": {"max_length": 128},
        "generate": {"num_train": 20000, "num_val": 1000, "num_test": 1000, "seed": 0,
                     "min_length": 20, "max_length": 128, "max_depth": 6, "max_args": 5},
    },
    "model": {
        "vocab_size": 17, "max_length": 128, "num_layers": 2, "embed_dim": 64, "num_heads": 2,
        "qkv_dim": 64, "mlp_dim": 128, "dropout_rate": 0.0, "attention_dropout_rate": 0.0,
        "pooling": "mean", "positional": "learned",
    },
    "train": {
        "steps": 3500, "batch_size": 32, "eval_every": 500, "log_every": 100,
        "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 200},
    },
    # Landmarks well below the 128-token length, so the quick run exercises the approximation.
    "attention_kwargs": {
        "nystrom": {"num_landmarks": 16}, "spectral_shift": {"num_landmarks": 16},
        "skyformer": {"num_landmarks": 16}, "performer": {"num_features": 64},
        "linformer": {"proj_len": 32}, "inducing_points": {"num_inducing_points": 16},
        "luna": {"packed_length": 16},
        "clustered": {"num_clusters": 16}, "improved_clustered": {"num_clusters": 16},
        "local": {"window": 8},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The ListOps config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("listops", arg, PRESETS)
