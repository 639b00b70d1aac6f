"""Retrieval (LRA): AAN citation-link document pairs at byte level.

Source: Radev et al. 2013 (ACL Anthology Network); LRA
`lra_benchmarks/matching/input_pipeline.py` (headerless 5-column TSV, ByteTextEncoder).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from spectral_jax import UsageError
from spectral_jax.lra.data.task import Split, Task
from spectral_jax.lra.data.tokens import (
    BYTE_VOCAB_SIZE,
    check_positive_int,
    encode_bytes,
    pack,
)

SPLIT_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "validation": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}


def _find_dir(data_dir: Path) -> Path:
    for cand in (data_dir, data_dir / "tsv_data"):
        if (cand / SPLIT_FILES["train"]).is_file():
            return cand
    raise FileNotFoundError(
        f"AAN retrieval data not found: no {SPLIT_FILES['train']} in {data_dir} or "
        f"{data_dir / 'tsv_data'}. Copy lra_release/tsv_data/new_aan_pairs.*.tsv there."
    )


def read_tsv(path: str | os.PathLike) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Reads one headerless AAN TSV: `label<TAB>id1<TAB>id2<TAB>text1<TAB>text2` per line.

    No quote handling (LRA reads with `use_quote_delim=False`); texts are taken as raw
    bytes. The label may be written as an int or a float ("1", "1.0") and must be 0 or 1.

    Args:
        path: a `new_aan_pairs.*.tsv` file.

    Returns:
        (byte ids of text1 per row, byte ids of text2 per row, int32 [N] labels).

    Raises:
        FileNotFoundError: if `path` does not exist.
        spectral_jax.UsageError: on a row without exactly 5 fields, a label other than 0/1, or an
            empty text; the message gives `path:line`.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "new_aan_pairs.test.tsv"
        >>> _ = p.write_bytes(b"1\\tA\\tB\\tab\\tc\\n")
        >>> a, b, y = read_tsv(p)
        >>> a[0].tolist(), b[0].tolist(), y.tolist()
        ([98, 99], [100], [1])
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"AAN split file not found: {path}")
    firsts, seconds, labels = [], [], []
    with open(path, "rb") as f:
        for line_num, line in enumerate(f, start=1):
            where = f"{path}:{line_num}"
            line = line.rstrip(b"\r\n")
            if line_num == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            if not line.strip():  # a blank line, e.g. a trailing one
                continue
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise UsageError(
                    f"{where}: expected 5 tab-separated fields (label, id1, id2, text1, "
                    f"text2), got {len(fields)}"
                )
            try:
                label = float(fields[0])
            except ValueError:
                label = -1.0
            if label not in (0.0, 1.0):
                raise UsageError(f"{where}: label must be 0 or 1, got {fields[0][:50]!r}")
            if not fields[3] or not fields[4]:
                raise UsageError(f"{where}: text1 and text2 must be non-empty")
            firsts.append(encode_bytes(fields[3]))
            seconds.append(encode_bytes(fields[4]))
            labels.append(int(label))
    return firsts, seconds, np.array(labels, np.int32)


def load(data_dir: str | os.PathLike, *, max_length: int = 4000) -> Task:
    """Loads AAN retrieval pairs: inputs [N, 2, L], byte ids truncated/padded per document.

    Splits: train = `.train.tsv`, validation = `.eval.tsv`, test = `.test.tsv`;
    `Task.truncated` counts truncated documents (two per row possible). Every row
    is kept (LRA dropped the last partial batch; use `iterate_batches` padding instead).
    Memory: int32 [147086, 2, 4000] is 4.7 GB for the full train split at the default L.

    Args:
        data_dir: folder with the three TSVs (or the release's parent of `tsv_data/`).
        max_length: L, bytes per document (LRA: 4000).

    Returns:
        Task "retrieval" with `dual=True`, vocab 257, 2 classes.

    Raises:
        FileNotFoundError: if a split file is missing.
        spectral_jax.UsageError: on a malformed row (see `read_tsv`) or bad `max_length`.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for f in SPLIT_FILES.values(): _ = (d / f).write_bytes(b"0\\ta\\tb\\txy\\tz\\n")
        >>> load(d, max_length=8).splits["test"].inputs.shape
        (1, 2, 8)
    """
    max_length = check_positive_int("retrieval", "max_length", max_length)
    folder = _find_dir(Path(data_dir))
    splits, truncated = {}, {}
    for split, name in SPLIT_FILES.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"AAN split file not found: {path}. Copy it from lra_release/tsv_data/."
            )
        firsts, seconds, labels = read_tsv(path)
        ids = np.empty((len(labels), 2, max_length), np.int32)
        mask = np.empty((len(labels), 2, max_length), bool)
        truncated[split] = 0
        for side, docs in enumerate((firsts, seconds)):
            ids[:, side], mask[:, side], cut = pack(docs, max_length)
            truncated[split] += cut
        splits[split] = Split(ids, mask, labels)
    return Task("retrieval", BYTE_VOCAB_SIZE, 2, max_length, True, splits,
                source=f"AAN TSV in {folder}", truncated=truncated)
