"""Image (LRA): CIFAR-10 in grayscale, 1024 pixel tokens, 10 classes.

    spectral-jax train --config configs/lra/image.py:attention=performer,protocol=small \\
        --config.data.dir=/data/cifar10 --workdir runs/image_perf

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``. ``data.dir`` holds
``cifar-10-batches-py/``. The ``quick`` preset takes Fashion-MNIST (784 pixels) when CIFAR-10 is
absent (``data.options.source=auto``; Debian package ``dataset-fashion-mnist``).
``data.options.mask_zero_pixels=True`` reproduces LRA's masking of black pixels as padding.

- ``lra``: ``image/configs/cifar10/transformer_base.py`` (1 layer, width 128, 8 heads, qkv 64,
  MLP 128, dropout 0.3 / attention 0.2, learned positions, CLS, AdamW b2=0.98 eps=1e-9 wd=0,
  base lr 5e-4, 175 warmup steps, cosine, 35000 steps of 256).
- ``small``: Nystromformer/Skyformer (2 layers, width 64, MEAN, lr 1e-4, linear, 35000 steps).
- ``quick``: 2 layers, 300 steps: a CPU smoke run, not a result.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.train import config_lib

_SMALL_MODEL = {**config_lib.SMALL_MODEL, "vocab_size": 256}

LRA = {
    "data": {"dir": "data/cifar10", "options": {"source": "cifar10"}},
    "model": {
        "vocab_size": 256, "max_length": 1024, "num_layers": 1, "embed_dim": 128,
        "num_heads": 8, "qkv_dim": 64, "mlp_dim": 128, "dropout_rate": 0.3,
        "attention_dropout_rate": 0.2, "pooling": "cls", "positional": "learned",
    },
    "train": {
        "steps": 35000, "batch_size": 256, "eval_every": 175, "eval_steps": 39,
        "log_every": 175,
        "optimizer": {"learning_rate": 5e-4, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
                      "weight_decay": 0.0},
        "schedule": {"name": "cosine", "warmup_steps": 175},
    },
}

SMALL = {
    "data": {"dir": "data/cifar10", "options": {"source": "cifar10"}},
    "model": {**_SMALL_MODEL, "max_length": 1024},
    "train": {
        "steps": 35000, "batch_size": 256, "eval_every": 175, "eval_steps": 20, "log_every": 175,
        "optimizer": config_lib.SMALL_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 175},
    },
}

QUICK = {
    "data": {"dir": "data/cifar10", "options": {"source": "auto"}},
    "model": {**_SMALL_MODEL, "max_length": 1024, "dropout_rate": 0.0},
    "train": {
        "steps": 300, "batch_size": 32, "eval_every": 100, "eval_steps": 20, "log_every": 50,
        "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 30},
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Image config for ``arg`` (see the module docstring)."""
    return config_lib.from_presets("image", arg, {"lra": LRA, "small": SMALL, "quick": QUICK})
