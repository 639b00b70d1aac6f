"""Byte-level language modelling over documents (task ``bytes_docs``), packed or padded.

    spectral-jax train --config lm/bytes_docs:quick,attention=linear --workdir runs/docs_linear
    spectral-jax train --config lm/bytes_docs:quick --config.data.options.packed=False \\
        --workdir runs/docs_padded

The paragraphs of the corpus (:mod:`spectral_jax.lra.data.bytes_docs`) in rows of
``data.options.context_length`` positions: packed with segment ids (``packed=True``, the
default) or one per row. Every target is scored in both, so the two runs learn the same
thing and differ in the padding they carry (``results.json`` reports tokens per second). The
method must take segment ids to train packed (softmax, local, linear, performer and the
recurrent family); the others raise, naming those. Arguments after ``:`` as for
``lm/bytes``; ``quick`` is the licenses corpus, rows of 512, 2 layers of width 64.
"""

from __future__ import annotations

import ml_collections

from spectral_jax.lra.configs.lm import bytes as bytes_config
from spectral_jax.lra.train import presets

QUICK = {
    **bytes_config.QUICK,
    "data": {"dir": "/usr/share/common-licenses",
             "options": {"corpus": "folder", "context_length": 512, "packed": True}},
    "model": {**bytes_config.QUICK["model"], "max_length": 512, "positional": "rope"},
    "train": {**bytes_config.QUICK["train"], "batch_size": 8},
}

PRESETS = {"quick": QUICK}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The document byte-LM config for ``arg`` (see the module docstring).

    Example:
        >>> config = get_config("quick,attention=linear")
        >>> config.task, config.data.options.packed, config.model.max_length
        ('bytes_docs', True, 512)
    """
    parts = [part for part in (arg or "").split(",") if part.strip()]
    if not any(part.strip().startswith("attention=") for part in parts):
        parts.append("attention=softmax")
    if not any(part.strip() == "quick" or part.strip().startswith("protocol=")
               for part in parts):
        parts.append("protocol=quick")
    return presets.task_config("bytes_docs", ",".join(parts), PRESETS)
