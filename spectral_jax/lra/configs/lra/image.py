"""Image (LRA): CIFAR-10 in grayscale, 1024 pixel tokens, 10 classes.

    spectral-jax train --config lra/image:attention=performer,protocol=small \\
        --config.data.dir=/data/cifar10 --workdir runs/image_perf

Arguments after ``:``: ``attention=<registry name>`` (default ``spectral_shift``),
``protocol=lra|small|quick`` (default ``lra``), ``quick``, ``seed=<int>``,
``max_length=<int>`` (the model's length; budgets are capped at it). ``data.dir`` holds
``cifar-10-batches-py/``. The ``quick`` preset is Fashion-MNIST (784 pixels, 10 classes; Debian
package ``dataset-fashion-mnist``, found under ``data.dir`` or ``/usr/share/datasets``).
``data.options.mask_zero_pixels=True`` reproduces LRA's masking of black pixels as padding.

- ``lra``: ``image/configs/cifar10/transformer_base.py`` (1 layer, width 128, 8 heads, qkv 64,
  MLP 128, dropout 0.3 / attention 0.2, learned positions, CLS, AdamW b2=0.98 eps=1e-9 wd=0,
  base lr 5e-4, 175 warmup steps, cosine, 35000 steps of 256).
- ``small``: Nystromformer/Skyformer (2 layers, width 64, MEAN, lr 1e-4, linear, 35000 steps).
- ``quick``: Fashion-MNIST sized for one run in at most about 6 minutes on 2 CPU cores, so
  that ``spectral-jax sweep`` can compare every method: LRA's 1-layer depth with the small
  protocol's width (64, 2 heads of 32, MLP 128, MEAN pooling, learned positions), 250 steps
  of 32 images (8,000 of the 54,000 training images, 15% of an epoch), validation on 16
  batches (512 images) at steps 125 and 250, test on the first 2,000 of the 10,000 test
  images (``data.options.test_examples``). Each method keeps its default budget (64
  landmarks, Skyformer 128, 256 Performer features, Linformer proj_len 256).
  Sizing, measured as process CPU time on a loaded 2-core machine (batch 32, n = 784):
  one train step took 1.46 s of CPU with softmax and 0.44 s with nystrom at 1 layer (3.16 s
  and 0.80 s at 2 layers), one evaluation batch 0.51 s and 0.12 s. A softmax run is then
  250 x 1.46 + (2 x 16 + 2 x 63) x 0.51 + about 20 s of compiling = 466 CPU-seconds, about
  4.9 minutes of wall time if XLA keeps 1.6 of the 2 cores busy (6.0 at 1.3); a nystrom run
  about a third of that. Exact kernelized attention costs about as much as softmax.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

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
    "data": {"dir": "data/fashion-mnist",
             "options": {"source": "fashion_mnist", "test_examples": 2000}},
    "model": {**_SMALL_MODEL, "num_layers": 1, "max_length": 784, "dropout_rate": 0.0},
    "train": {
        "steps": 250, "batch_size": 32, "eval_every": 125, "eval_steps": 16, "log_every": 25,
        "grad_clip_norm": 1.0,
        "optimizer": config_lib.QUICK_OPTIMIZER,
        "schedule": {"name": "linear", "warmup_steps": 25},
    },
}


PRESETS = {"lra": LRA, "small": SMALL, "quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Image config for ``arg`` (see the module docstring; computed by ``task_config``)."""
    return presets.task_config("image", arg, PRESETS)
