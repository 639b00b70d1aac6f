"""Byte-level language modelling: enwik8, text8, or a folder of text files (the licenses).

Sources:

- ``enwik8``: the first 10⁸ bytes of the English Wikipedia XML dump of 3 March 2006 (Hutter
  Prize, http://mattmahoney.net/dc/enwik8.zip); ``text8``: the same text lowercased to
  ``a-z`` and space (http://mattmahoney.net/dc/text8.zip). Both are split as in every
  published result (Al-Rfou et al. 2019; Dai et al. 2019, Transformer-XL's
  ``prep_enwik8.py``): the first 90M bytes train, the next 5M validation, the last 5M test.
  Here the held-out parts are ``heldout_fraction`` (0.05) of the file each, which is exactly
  5M for the 10⁸-byte files and keeps the same layout on small files.
- ``folder``: every regular file in ``data_dir``, sorted by name, symlinks to one file read
  once, joined by a newline, then split the same way. The default folder is Debian's
  ``/usr/share/common-licenses`` (about 250 KB of English license text: Apache-2.0, the
  GPL/LGPL/GFDL versions, MPL, BSD, CC0, Artistic). It ships in ``base-files``, an
  *Essential* package, so it exists on every Debian and Ubuntu system and image (the slim
  Python images included), holds the same bytes on every machine of one release, is
  natural prose, and is big enough for a CPU run of a few minutes yet small enough to read
  in milliseconds. Python's own sources would also be everywhere, but they differ between
  Python versions and are code, not text.

Ids are bytes + 1 (vocabulary 257, 0 = padding), as the LRA Text task
(:func:`spectral_jax.lra.data.tokens.encode_bytes`). Each split is cut into windows of
``context_length + 1`` ids that overlap by one (stride ``context_length``), so every byte after
a split's first is predicted exactly once: the model reads ids ``0..L-1`` of a window and
predicts ids ``1..L``; the last window is zero-padded (``mask`` False). A window's label is its
last real id, so the split's majority baseline is the accuracy of always predicting the most
frequent byte.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from spectral_jax import UsageError, _checks
from spectral_jax.lra.data.task import SPLIT_NAMES, Split, Task
from spectral_jax.lra.data.tokens import BYTE_VOCAB_SIZE, encode_bytes

CORPORA = ("folder", "enwik8", "text8")
# The folder corpus every Debian/Ubuntu machine has (package base-files, Essential).
LICENSES_DIR = "/usr/share/common-licenses"
_DOWNLOADS = {"enwik8": "http://mattmahoney.net/dc/enwik8.zip",
              "text8": "http://mattmahoney.net/dc/text8.zip"}


def read_corpus(data_dir: str | os.PathLike, corpus: str) -> tuple[bytes, str]:
    """The raw bytes of ``corpus`` and where they were read from.

    Args:
        data_dir: for ``enwik8`` / ``text8``, a folder holding the raw file of that name (or
          its ``.zip``), or the file itself; for ``folder``, the folder of text files.
        corpus: one of :data:`CORPORA`.

    Raises:
        FileNotFoundError: the file or folder is missing (the message says where to get it).
        spectral_jax.UsageError: an unknown ``corpus``; an empty corpus.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "b.txt").write_bytes(b"world"); _ = (d / "a.txt").write_bytes(b"hello")
        >>> read_corpus(d, "folder")[0]
        b'hello\\nworld'
    """
    _checks.choice("bytes_lm", "corpus", corpus, CORPORA)
    path = Path(data_dir)
    if corpus == "folder":
        if not path.is_dir():
            raise FileNotFoundError(
                f"bytes_lm: no folder {path}; the corpus 'folder' reads every file in "
                f"data.dir (on Debian/Ubuntu {LICENSES_DIR} always exists)")
        seen, parts = set(), []
        for file in sorted(path.iterdir()):
            real = file.resolve()
            if file.is_file() and real not in seen:
                seen.add(real)
                parts.append(file.read_bytes())
        raw, source = b"\n".join(parts), f"{len(parts)} files in {path}"
    else:
        raw, source = _read_raw(path, corpus)
    if not raw:
        raise UsageError(f"bytes_lm: the {corpus} corpus in {path} is empty")
    return raw, source


def _read_raw(path: Path, name: str) -> tuple[bytes, str]:
    for cand in (path, path / name):
        if cand.is_file():
            return cand.read_bytes(), f"{name} file {cand}"
    for cand in (path / f"{name}.zip", path if path.suffix == ".zip" else None):
        if cand is not None and cand.is_file():
            with zipfile.ZipFile(cand) as archive:
                return archive.read(name), f"{name} in {cand}"
    raise FileNotFoundError(
        f"bytes_lm: no {name} file in {path} (looked for {path / name} and "
        f"{path / (name + '.zip')}); download {_DOWNLOADS[name]} into that folder")


def split_bytes(raw: bytes, heldout_fraction: float) -> dict[str, bytes]:
    """Train / validation / test as contiguous parts: ``1 - 2f``, ``f``, ``f`` of the bytes.

    Raises:
        spectral_jax.UsageError: a part would be empty.

    Example:
        >>> {k: len(v) for k, v in split_bytes(bytes(100), 0.05).items()}
        {'train': 90, 'validation': 5, 'test': 5}
    """
    held = round(heldout_fraction * len(raw))
    if held < 2 or len(raw) - 2 * held < 2:
        raise UsageError(
            f"bytes_lm: {len(raw)} bytes with heldout_fraction={heldout_fraction} leave a split "
            "with fewer than 2 bytes; use a larger corpus or another heldout_fraction")
    train_end = len(raw) - 2 * held
    return {"train": raw[:train_end], "validation": raw[train_end:train_end + held],
            "test": raw[train_end + held:]}


def windows(ids: np.ndarray, context_length: int) -> Split:
    """Cuts one split's ids into windows of ``context_length + 1`` overlapping by one.

    Returns:
        A :class:`Split` with inputs int32 ``[N, context_length + 1]``, N =
        ``ceil((len(ids) - 1) / context_length)``, the last window zero-padded, and labels
        the last real id of each window.

    Example:
        >>> s = windows(np.array([1, 2, 3, 4, 5, 6], np.int32), 2)
        >>> s.inputs.tolist(), s.labels.tolist()
        ([[1, 2, 3], [3, 4, 5], [5, 6, 0]], [3, 5, 6])
    """
    n = max(1, -(-(len(ids) - 1) // context_length))
    width = context_length + 1
    padded = np.zeros(n * context_length + 1, np.int32)
    padded[: len(ids)] = ids
    starts = np.arange(n) * context_length
    inputs = padded[starts[:, None] + np.arange(width)[None, :]]
    mask = (starts[:, None] + np.arange(width)[None, :]) < len(ids)
    last = np.minimum(starts + context_length, len(ids) - 1)
    return Split(inputs, mask, ids[last].astype(np.int32))


def load(
    data_dir: str | os.PathLike,
    *,
    corpus: str = "folder",
    context_length: int = 256,
    heldout_fraction: float = 0.05,
) -> Task:
    """Loads a byte-level language-modelling task (see the module docstring).

    Args:
        data_dir: the corpus's folder (or, for enwik8 / text8, the file).
        corpus: ``"folder"`` (every file in ``data_dir``), ``"enwik8"`` or ``"text8"``.
        context_length: L, the bytes the model reads per window (it predicts L).
        heldout_fraction: the validation and the test part, each, as a fraction of the bytes
          (0.05: the standard 90M/5M/5M split of enwik8 and text8).

    Returns:
        Task ``"bytes_lm"``: inputs int32 ``[N, L + 1]``, vocabulary 257 and 257 classes
        (the label is a byte id).

    Raises:
        FileNotFoundError: the corpus is missing (the message says where to get it).
        spectral_jax.UsageError, spectral_jax.UsageTypeError: a bad option; a corpus too
          small for the split.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "text8").write_bytes(b"the quick brown fox jumps over the lazy dog " * 10)
        >>> task = load(d, corpus="text8", context_length=8, heldout_fraction=0.1)
        >>> task.max_length, [len(task.splits[s]) for s in ("train", "validation", "test")]
        (9, [44, 6, 6])
    """
    context_length = _checks.positive_int("bytes_lm", "context_length", context_length)
    heldout_fraction = _checks.number("bytes_lm", "heldout_fraction", heldout_fraction,
                                      low=0.0, high=0.5, low_open=True, high_open=True)
    raw, source = read_corpus(data_dir, corpus)
    parts = split_bytes(raw, heldout_fraction)
    splits = {name: windows(encode_bytes(parts[name]), context_length) for name in SPLIT_NAMES}
    return Task("bytes_lm", BYTE_VOCAB_SIZE, BYTE_VOCAB_SIZE, context_length + 1, False, splits,
                source=f"{source} ({corpus}, {len(raw)} bytes)")
