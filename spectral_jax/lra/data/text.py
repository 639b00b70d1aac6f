"""Text (LRA): IMDB sentiment at byte level from the original `aclImdb` folder tree.

Source: Maas et al. 2011 (IMDB); LRA `lra_benchmarks/text_classification/input_pipeline.py`
(ByteTextEncoder: byte b -> b + 1, pad 0).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.lra.data.task import Split, Task
from spectral_jax.lra.data.tokens import (
    BYTE_VOCAB_SIZE,
    check_positive_int,
    encode_bytes,
    pack,
)

CLASSES = ("neg", "pos")  # label 0 = negative, 1 = positive (as tfds imdb_reviews).


def _find_root(data_dir: Path) -> Path:
    for cand in (data_dir / "aclImdb", data_dir):
        if (cand / "train").is_dir() and (cand / "test").is_dir():
            return cand
    raise FileNotFoundError(
        f"IMDB data not found: expected {data_dir / 'aclImdb'}/{{train,test}}/{{pos,neg}}/*.txt. "
        f"Download aclImdb_v1.tar.gz (https://ai.stanford.edu/~amaas/data/sentiment/) and "
        f"untar it into {data_dir}."
    )


def read_split(folder: str | os.PathLike) -> tuple[list[np.ndarray], np.ndarray, list[Path]]:
    """Reads `folder/{neg,pos}/*.txt` (files sorted by name, neg first).

    Args:
        folder: an `aclImdb/train` or `aclImdb/test` directory.

    Returns:
        (byte-level int32 id arrays, int32 [N] labels 0 = neg / 1 = pos, file paths).

    Raises:
        FileNotFoundError: if `neg/` or `pos/` is missing or holds no `.txt` file.
        spectral_jax.UsageError: if a review file is empty (it would be an all-padding row).

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for c in ("neg", "pos"):
        ...     (d / c).mkdir(); _ = (d / c / "0_1.txt").write_bytes(b"ok")
        >>> read_split(d)[1].tolist()
        [0, 1]
    """
    folder = Path(folder)
    seqs, labels, paths = [], [], []
    for label, name in enumerate(CLASSES):
        sub = folder / name
        files = sorted(sub.glob("*.txt")) if sub.is_dir() else []
        if not files:
            raise FileNotFoundError(
                f"IMDB: no *.txt reviews in {sub}; expected the aclImdb layout "
                f"{{train,test}}/{{pos,neg}}/<id>_<rating>.txt"
            )
        for path in files:
            data = path.read_bytes()
            if not data:
                raise UsageError(f"IMDB: empty review file {path}")
            seqs.append(encode_bytes(data))
            labels.append(label)
            paths.append(path)
    return seqs, np.array(labels, np.int32), paths


def load(
    data_dir: str | os.PathLike,
    *,
    max_length: int = 4000,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Task:
    """Loads byte-level IMDB; validation is a seeded held-out slice of train.

    LRA validated on the test split; here `round(val_fraction * 25000)` train reviews,
    chosen by `np.random.default_rng(seed).permutation`, form the validation split and
    are removed from train, so test stays unseen. Ids: byte + 1 (vocab 257), truncated
    or zero-padded to `max_length` (LRA code 1000, LRA paper 4000); truncations are
    counted in `Task.truncated`.

    Args:
        data_dir: folder containing `aclImdb/` (or the `aclImdb` folder itself).
        max_length: sequence length L in bytes, >= 1.
        val_fraction: held-out fraction of train, in [0, 1).
        seed: seed of the held-out selection.

    Returns:
        Task "text": inputs int32 [N, L], 2 classes.

    Raises:
        FileNotFoundError: if the folder tree is missing (message says where to put it).
        TypeError / ValueError: on bad options or an empty review file.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for s in ("train", "test"):
        ...     for c in ("neg", "pos"):
        ...         p = d / "aclImdb" / s / c; p.mkdir(parents=True)
        ...         for i in range(5): _ = (p / f"{i}_1.txt").write_bytes(b"fine film")
        >>> t = load(d, max_length=16, val_fraction=0.2)
        >>> len(t.splits["train"]), len(t.splits["validation"]), len(t.splits["test"])
        (8, 2, 10)
    """
    max_length = check_positive_int("text", "max_length", max_length)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise UsageTypeError(f"text: val_fraction must be a float, got {val_fraction!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"text: val_fraction must be in [0, 1), got {val_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise UsageTypeError(f"text: seed must be an int, got {seed!r}")
    root = _find_root(Path(data_dir))
    train_seqs, train_labels, _ = read_split(root / "train")
    test_seqs, test_labels, _ = read_split(root / "test")
    n = len(train_seqs)
    held_out = np.zeros(n, bool)
    held_out[np.random.default_rng(seed).permutation(n)[: round(val_fraction * n)]] = True
    parts = {
        "train": ([s for s, h in zip(train_seqs, held_out) if not h], train_labels[~held_out]),
        "validation": ([s for s, h in zip(train_seqs, held_out) if h], train_labels[held_out]),
        "test": (test_seqs, test_labels),
    }
    splits, truncated = {}, {}
    for split, (seqs, labels) in parts.items():
        ids, mask, truncated[split] = pack(seqs, max_length)
        splits[split] = Split(ids, mask, labels)
    return Task("text", BYTE_VOCAB_SIZE, len(CLASSES), max_length, False, splits,
                source=f"aclImdb in {root}", truncated=truncated)
