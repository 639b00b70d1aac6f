"""Multi-query associative recall (task ``mqar``): a causal model scored on its answers only.

    spectral-jax train --config lm/mqar:attention=softmax --workdir runs/mqar_quick
    spectral-jax train --config lm/mqar:protocol=small,attention=linear,width=128,seq_len=256 \\
        --config.train.optimizer.learning_rate=2.15e-3 --workdir runs/mqar_linear_256_d128

The data is generated in memory (:mod:`spectral_jax.lra.data.mqar`; Arora et al. 2023,
"Zoology", arXiv:2312.04927); ``data.dir`` is not read. Arguments after ``:``: those of every
task config, ``attention=<registry name>`` (a method with a causal form; default ``softmax``),
``protocol=small|quick`` (default ``quick``), ``seed=<int>``, ``max_length=<int>``; and
``width=<int>`` (the model width, ``embed_dim`` = ``qkv_dim``; default 64), ``seq_len=<int>``
(L, also the model's ``max_length``; default 64) and ``num_kv_pairs=<int>`` (K; default
Zoology's K for that L: 4, 8, 16, 64 at 64, 128, 256, 512, else ``L // 16``). The learning
rate is the field ``train.optimizer.learning_rate``: Zoology trains each cell at 1e-4,
4.64e-4, 2.15e-3 and 1e-2 and reports the best. Changing ``data.options.seq_len`` alone
leaves ``model.max_length`` and the batch behind; use the ``seq_len`` argument.

``accuracy`` (metrics.jsonl) and ``test_accuracy`` (results.json) count the K answer
positions of each sequence only (objective ``token_targets``,
:func:`spectral_jax.lra.train.objectives.token_target_metrics`), as Zoology's metric does.

- ``small``: Zoology's Figure 2 protocol. Vocabulary 8,192, 100,000 training and 3,000
  validation and test sequences, filler 0, ``a = 0.01``; 2 layers, 1 head, learned
  positions, dropout 0.1 on the attention weights, embeddings N(0, 0.02); AdamW (0.9,
  0.999, eps 1e-8, weight decay 0.1), lr 1e-3, cosine to 0 without warmup; 64 epochs at
  batch 512 (L <= 128), 256 (L = 256) or 128 (L >= 512), validated once per epoch.
- ``quick``: L=64, K=4, 20,000 training sequences, width 64, lr 3e-3 after 50 warmup steps,
  1,500 steps of 64 (about 0.5 s a step on two CPU cores): a check of the pipeline, not a
  result.

Differences from Zoology's model that remain: each block has an MLP (``mlp_dim`` = 2 *
width; Zoology's have none), the output head is not tied to the embedding, the embedding
output is not dropped out, the cosine is stepped every step (Zoology: every epoch), and
training does not stop early at 0.99 validation accuracy.
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections

from spectral_jax import _checks
from spectral_jax.lra.data import mqar
from spectral_jax.lra.train import config_lib, presets

ARGS: dict[str, Any] = {**config_lib.TASK_ARGS, "attention": "softmax", "protocol": "quick",
                        "width": 64, "seq_len": 64, "num_kv_pairs": int}
_OWNER = "lm/mqar"
# data.dir is not read; a fixed absolute path keeps a run's recorded config the same from any
# working directory (a relative one would be resolved against it).
_NOT_READ = "/dev/null"
_EPOCHS, _TRAIN = 64, 100_000


def zoology_batch_size(seq_len: int) -> int:
    """Zoology's Figure 2 batch for ``seq_len``: 512 up to 128, 256 up to 256, then 128.

    Example:
        >>> [zoology_batch_size(n) for n in (64, 128, 256, 512)]
        [512, 512, 256, 128]
    """
    return 512 if seq_len <= 128 else 256 if seq_len <= 256 else 128


def make_presets(width: int = 64, seq_len: int = 64,
                 num_kv_pairs: int | None = None) -> dict[str, dict[str, Any]]:
    """The ``small`` (Zoology) and ``quick`` presets for one width and one (L, K) cell.

    Raises:
        spectral_jax.UsageError, spectral_jax.UsageTypeError: a width below 1, or an (L, K)
          the generator refuses (:func:`spectral_jax.lra.data.mqar.check_sizes`).

    Example:
        >>> make_presets(128, 256)["small"]["data"]["options"]["num_kv_pairs"]
        16
    """
    width = _checks.positive_int(_OWNER, "width", width)
    if num_kv_pairs is None:
        num_kv_pairs = mqar.ZOOLOGY_PAIRS.get(seq_len, max(1, seq_len // 16))
    mqar.check_sizes(seq_len, num_kv_pairs)
    model = {"vocab_size": None, "max_length": seq_len, "num_layers": 2, "embed_dim": width,
             "qkv_dim": width, "num_heads": 1, "mlp_dim": 2 * width, "pooling": "mean",
             "positional": "learned", "is_causal": True, "embed_init_std": 0.02,
             "dropout_rate": 0.0, "attention_dropout_rate": 0.1}
    optimizer = {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
                 "weight_decay": 0.1}
    data = {"seq_len": seq_len, "num_kv_pairs": num_kv_pairs, "vocab_size": mqar.VOCAB_SIZE,
            "power_a": 0.01, "random_non_queries": False, "seed": 0}
    batch = zoology_batch_size(seq_len)
    epoch = math.ceil(_TRAIN / batch)
    small = {
        "data": {"dir": _NOT_READ, "options": {**data, "num_train": _TRAIN, "num_val": 3000,
                                               "num_test": 3000}},
        "model": model,
        "train": {"steps": _EPOCHS * epoch, "batch_size": batch, "eval_every": epoch,
                  "log_every": 50, "optimizer": optimizer,
                  "schedule": {"name": "cosine", "warmup_steps": 0}},
    }
    quick = {
        "data": {"dir": _NOT_READ, "options": {**data, "num_train": 20_000, "num_val": 500,
                                               "num_test": 500}},
        "model": {**model, "attention_dropout_rate": 0.0},
        "train": {"steps": 1500, "batch_size": 64, "eval_every": 250, "log_every": 50,
                  "optimizer": {**optimizer, "learning_rate": 3e-3},
                  "schedule": {"name": "cosine", "warmup_steps": 50}},
        "attention_kwargs": {"performer": {"num_features": 64}},
    }
    return {"small": small, "quick": quick}


PRESETS = make_presets()


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The MQAR config for ``arg`` (see the module docstring; computed by ``task_config``).

    Raises:
        spectral_jax.UsageError: an unknown argument, method or protocol; a width, seq_len or
          num_kv_pairs out of range (the message names the range).

    Example:
        >>> config = get_config("width=128,seq_len=128")
        >>> config.task, config.model.embed_dim, config.data.options.num_kv_pairs
        ('mqar', 128, 8)
        >>> get_config("protocol=small").train.batch_size
        512
    """
    a = config_lib.parse_arg(arg, **ARGS)
    task_arg = [f"attention={a.attention}", f"protocol={'quick' if a.quick else a.protocol}",
                f"seed={a.seed}"]
    if a.max_length is not None:
        task_arg.append(f"max_length={a.max_length}")
    if a.spt:
        task_arg.append("spt")
    return presets.task_config("mqar", ",".join(task_arg),
                               make_presets(a.width, a.seq_len, a.num_kv_pairs))
