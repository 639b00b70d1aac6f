"""Byte-level language modelling over documents, padded one per row or packed.

The corpus (:func:`spectral_jax.lra.data.bytes_lm.read_corpus`, split into train,
validation and test as there) is cut into documents at blank lines (its paragraphs), each
document into pieces of at most ``context_length + 1`` ids. A piece of m + 1 ids is one
example of m inputs and m targets (the next id). Padded, each piece fills one row of
``context_length`` positions and the rest is padding; packed
(:func:`spectral_jax.lra.data.packing.pack`), pieces share rows, kept apart by their
segment ids, with positions that restart per piece. The objective scores every target
(``token_targets``), so the two layouts train on the same predictions; packing only removes
the padding the rows would carry.
"""

from __future__ import annotations

import os

import numpy as np

from spectral_jax import _checks
from spectral_jax.lra.data.bytes_lm import read_corpus, split_bytes
from spectral_jax.lra.data.packing import lay_out, pack
from spectral_jax.lra.data.task import IGNORE_INDEX, SPLIT_NAMES, Split, Task
from spectral_jax.lra.data.tokens import BYTE_VOCAB_SIZE, encode_bytes


def pieces(raw: bytes, context_length: int) -> list[np.ndarray]:
    """The paragraphs of ``raw`` as ids, cut into pieces of 2 to ``context_length + 1``.

    Example:
        >>> [p.tolist() for p in pieces(b"ab\\n\\ncdefg", 2)]
        [[98, 99], [100, 101, 102], [102, 103, 104]]
    """
    out = []
    for paragraph in raw.split(b"\n\n"):
        ids = encode_bytes(paragraph.strip())
        for start in range(0, max(len(ids) - 1, 0), context_length):
            piece = ids[start:start + context_length + 1]
            if len(piece) >= 2:
                out.append(np.asarray(piece, np.int32))
    return out


def rows(docs: list[np.ndarray], context_length: int, packed: bool) -> Split:
    """One split's rows: a piece per row (padded) or packed; labels are each row's last
    target, as for ``bytes_lm``."""
    inputs, targets = [d[:-1] for d in docs], [d[1:] for d in docs]
    if packed:
        p = pack(inputs, context_length)
        x, y = p.tokens, lay_out(targets, p, IGNORE_INDEX)
        extra = {"segment_ids": p.segment_ids, "positions": p.positions}
    else:
        x = np.zeros((len(docs), context_length), np.int32)
        y = np.full((len(docs), context_length), IGNORE_INDEX, np.int32)
        for i, (a, b) in enumerate(zip(inputs, targets)):
            x[i, :len(a)], y[i, :len(b)] = a, b
        extra = {}
    scored = y != IGNORE_INDEX
    last = np.where(scored.any(1), y[np.arange(len(y)), scored.shape[1] - 1 - np.argmax(
        scored[:, ::-1], axis=1)], 0).astype(np.int32)
    return Split(x, scored, last, targets=y, **extra)


def load(data_dir: str | os.PathLike, *, corpus: str = "folder", context_length: int = 128,
         heldout_fraction: float = 0.05, packed: bool = True) -> Task:
    """Loads the document byte-LM task (see the module docstring).

    Args:
        data_dir, corpus, heldout_fraction: as :func:`spectral_jax.lra.data.bytes_lm.load`.
        context_length: L, the positions of a row.
        packed: pack the pieces (True) or give each its own row (False).

    Returns:
        Task ``"bytes_docs"``: inputs and targets int32 ``[N, L]``, vocabulary 257; packed,
        with ``segment_ids`` and ``positions``.

    Raises:
        FileNotFoundError: the corpus is missing.
        spectral_jax.UsageError, spectral_jax.UsageTypeError: a bad option.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_bytes(b"one two\\n\\nthree\\n\\nfour five six\\n\\n" * 20)
        >>> task = load(d, context_length=16, heldout_fraction=0.1)
        >>> task.max_length, int(task.splits["train"].segment_ids.max()) > 1
        (16, True)
    """
    context_length = _checks.positive_int("bytes_docs", "context_length", context_length)
    heldout_fraction = _checks.number("bytes_docs", "heldout_fraction", heldout_fraction,
                                      low=0.0, high=0.5, low_open=True, high_open=True)
    packed = _checks.boolean("bytes_docs", "packed", packed)
    raw, source = read_corpus(data_dir, corpus)
    parts = split_bytes(raw, heldout_fraction)
    splits = {name: rows(pieces(parts[name], context_length), context_length, packed)
              for name in SPLIT_NAMES}
    padding = {name: round(float(1 - s.mask.mean()), 4) for name, s in splits.items()}
    layout = "packed" if packed else "one document per row"
    return Task("bytes_docs", BYTE_VOCAB_SIZE, BYTE_VOCAB_SIZE, context_length, False, splits,
                source=f"{source} ({corpus}, {len(raw)} bytes, paragraphs {layout}, padding "
                       f"{padding})")
