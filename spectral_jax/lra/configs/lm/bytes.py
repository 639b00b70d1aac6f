"""Byte-level language modelling (task ``bytes_lm``): a causal model scored in bits per byte.

    spectral-jax train --config lm/bytes:quick,attention=linear --workdir runs/lm_linear
    spectral-jax generate --workdir runs/lm_linear --prompt "GNU GENERAL " --max-new-tokens 80
    spectral-jax train --config lm/bytes:protocol=small,attention=performer \\
        --config.data.dir=/data/enwik8 --workdir runs/enwik8_performer

Arguments after ``:``: ``attention=<registry name>`` (a method with a causal form; default
``softmax`` here), ``protocol=small|quick`` (``quick`` alone works too), ``seed=<int>``,
``max_length=<int>`` (the model's positions). The corpus is ``data.options.corpus``
(``folder``, ``enwik8``, ``text8``) read from ``data.dir``
(:mod:`spectral_jax.lra.data.bytes_lm`); the window is ``data.options.context_length`` bytes
and the model's ``max_length`` is one more (a window holds its targets' last byte).

- ``quick``: Debian's ``/usr/share/common-licenses`` (about 250 KB of license text, on every
  Debian/Ubuntu machine), windows of 128 bytes, 2 layers of width 64, 200 steps of 16
  windows: a CPU run of a few minutes that learns common words, not a result.
- ``small``: enwik8 with the standard 90M/5M/5M split (download
  http://mattmahoney.net/dc/enwik8.zip into ``data.dir``; ``corpus=text8`` for text8),
  windows of 512 bytes, 4 layers of width 256, 20000 steps of 32 windows.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.train import config_lib, presets

_MODEL = {"vocab_size": 257, "pooling": "mean", "positional": "learned", "is_causal": True,
          "attention_dropout_rate": 0.0, "embed_init_std": 0.02}

QUICK = {
    "data": {"dir": "/usr/share/common-licenses",
             "options": {"corpus": "folder", "context_length": 128}},
    "model": {**_MODEL, "max_length": 129, "num_layers": 2, "embed_dim": 64, "num_heads": 2,
              "qkv_dim": 64, "mlp_dim": 256, "dropout_rate": 0.0},
    "train": {
        "steps": 200, "batch_size": 16, "eval_every": 100, "log_every": 50, "grad_clip_norm": 1.0,
        "optimizer": {**config_lib.QUICK_OPTIMIZER, "learning_rate": 3e-3},
        "schedule": {"name": "linear", "warmup_steps": 20},
    },
    "attention_kwargs": {"performer": {"num_features": 64}},
}

SMALL = {
    "data": {"dir": "data/enwik8", "options": {"corpus": "enwik8", "context_length": 512}},
    "model": {**_MODEL, "max_length": 513, "num_layers": 4, "embed_dim": 256, "num_heads": 4,
              "qkv_dim": 256, "mlp_dim": 1024, "dropout_rate": 0.1},
    "train": {
        "steps": 20000, "batch_size": 32, "eval_every": 1000, "eval_steps": 200,
        "log_every": 100, "grad_clip_norm": 1.0,
        "optimizer": {**config_lib.QUICK_OPTIMIZER, "learning_rate": 1e-3},
        "schedule": {"name": "cosine", "warmup_steps": 1000},
    },
}

PRESETS = {"quick": QUICK, "small": SMALL}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The byte-LM config for ``arg`` (see the module docstring; computed by ``task_config``).

    Example:
        >>> config = get_config("quick,attention=linear")
        >>> config.task, config.model.is_causal, config.data.options.context_length
        ('bytes_lm', True, 128)
    """
    parts = [part for part in (arg or "").split(",") if part.strip()]
    if not any(part.strip().startswith("attention=") for part in parts):
        parts.append("attention=softmax")  # the LRA default (spectral_shift) has no causal form
    if not any(part.strip() in ("quick", "protocol=quick", "protocol=small")
               or part.strip().startswith("protocol=") for part in parts):
        parts.append("protocol=quick")  # there is no "lra" protocol for this task
    return presets.task_config("bytes_lm", ",".join(parts), PRESETS)
