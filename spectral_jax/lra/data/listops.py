"""ListOps (LRA): the vocabulary and the release-format reader.

The generator and the independent evaluator are in :mod:`spectral_jax.lra.data.listops_generator`.

Sources: Nangia & Bowman 2018 (ListOps); Tay et al. 2021 (LRA), generator
`google-research/long-range-arena: lra_benchmarks/data/listops.py` and the fixed
(2021-03-04) input pipeline `lra_benchmarks/listops/input_pipeline.py`.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from spectral_jax import UsageError
from spectral_jax.lra.data.task import Split, Task
from spectral_jax.lra.data.tokens import check_positive_int, pack

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
# Fixed id order, so ids are identical in every process (LRA's came from a Python set).
VOCAB = ("<pad>", *OPERATORS, END, *"0123456789", "<unk>")
TOKEN_TO_ID = {tok: i for i, tok in enumerate(VOCAB)}
PAD_ID = 0
UNK_ID = VOCAB.index("<unk>")
VOCAB_SIZE = len(VOCAB)  # 17 = 15 symbols + pad + unknown, as LRA.
NUM_CLASSES = 10
SPLIT_FILES = {"train": "basic_train.tsv", "validation": "basic_val.tsv", "test": "basic_test.tsv"}
_DROP_PARENS = str.maketrans("", "", "()")


def tokenize(source: str) -> list[str]:
    """Splits a ListOps expression into tokens the way LRA's fixed pipeline does.

    `(` and `)` are dropped, `]` stays a token of its own (dropping it, as LRA's
    pre-2021 pipeline did, makes the tree ambiguous), then whitespace split.

    Args:
        source: an expression in the release's parenthesised form, e.g.
            "( ( ( [MAX 2 ) 9 ) ] )", or the plain form "[MAX 2 9 ]".

    Returns:
        The list of tokens, e.g. ["[MAX", "2", "9", "]"].

    Example:
        >>> tokenize("( ( ( [MAX 2 ) 9 ) ] )")
        ['[MAX', '2', '9', ']']
    """
    return source.translate(_DROP_PARENS).split()


def encode(source: str) -> np.ndarray:
    """Token ids of a ListOps expression (see `VOCAB`; pad 0, `<unk>` 16 never produced).

    Args:
        source: expression string, parenthesised or plain.

    Returns:
        int32 [T] ids in [1, 15], T = number of tokens.

    Raises:
        spectral_jax.UsageError: if a token is not one of the 15 ListOps symbols (the vocabulary is
            closed, so an unknown token means a corrupt file, not rare data).

    Example:
        >>> encode("[MAX 2 9 ]").tolist()
        [2, 8, 15, 5]
    """
    toks = tokenize(source)
    try:
        return np.fromiter(map(TOKEN_TO_ID.__getitem__, toks), np.int32, count=len(toks))
    except KeyError as err:
        raise UsageError(
            f"unknown ListOps token {err.args[0]!r}; allowed: {' '.join(VOCAB[1:-1])}"
        ) from None


def _find_dir(data_dir: Path) -> Path:
    for cand in (data_dir, data_dir / "listops-1000"):
        if (cand / SPLIT_FILES["train"]).is_file():
            return cand
    raise FileNotFoundError(
        f"ListOps data not found: no {SPLIT_FILES['train']} in {data_dir} or "
        f"{data_dir / 'listops-1000'}. Copy the LRA release's listops-1000/ folder there, "
        f"or generate it with `spectral-jax data listops --out {data_dir}`."
    )


def read_tsv(path: str | os.PathLike) -> tuple[list[np.ndarray], np.ndarray]:
    """Reads one release ListOps TSV (header `Source\\tTarget`).

    Args:
        path: a `basic_*.tsv` file.

    Returns:
        (list of int32 [T_i] token-id arrays, int32 [N] labels in 0..9).

    Raises:
        FileNotFoundError: if `path` does not exist.
        spectral_jax.UsageError: on a bad header, a row without exactly 2 fields, a Target outside
            0-9, an unknown token or an empty Source; the message gives `path:line`.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "basic_val.tsv"
        >>> _ = p.write_text("Source\\tTarget\\n( ( ( [MAX 2 ) 9 ) ] )\\t9\\n")
        >>> ids, labels = read_tsv(p)
        >>> ids[0].tolist(), labels.tolist()
        ([2, 8, 15, 5], [9])
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ListOps split file not found: {path}")
    seqs, labels = [], []
    # utf-8-sig: a byte-order mark (editors on Windows add one) is not part of the header.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header != ["Source", "Target"]:
            raise UsageError(f"{path}:1: expected the header 'Source<TAB>Target', got {header!r}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:  # a blank line, e.g. a trailing one
                continue
            if len(row) != 2:
                raise UsageError(
                    f"{where}: expected 2 tab-separated fields (Source, Target), got "
                    f"{len(row)}: {row!r:.200}"
                )
            if row[1].strip() not in tuple("0123456789"):
                raise UsageError(f"{where}: Target must be a digit 0-9, got {row[1]!r:.50}")
            try:
                ids = encode(row[0])
            except ValueError as err:
                raise UsageError(f"{where}: {err}") from None
            if ids.size == 0:
                raise UsageError(f"{where}: empty Source expression")
            seqs.append(ids)
            labels.append(int(row[1]))
    return seqs, np.array(labels, np.int32)


def load(data_dir: str | os.PathLike, *, max_length: int = 2000) -> Task:
    """Loads ListOps from `basic_{train,val,test}.tsv` (LRA release or `generate`).

    Looks in `data_dir` and `data_dir/listops-1000`. Tokens as `tokenize`, ids per
    `VOCAB` (vocab_size 17), truncated or zero-padded to `max_length` (truncations are
    counted in `Task.truncated`).

    Args:
        data_dir: folder holding the three TSV files (or their `listops-1000` parent).
        max_length: sequence length L (LRA: 2000).

    Returns:
        Task "listops": inputs int32 [N, L], 10 classes.

    Raises:
        FileNotFoundError: if a split file is missing (message says how to get it).
        spectral_jax.UsageError: on a malformed file (see `read_tsv`) or bad `max_length`.

    Example:
        >>> import tempfile
        >>> from spectral_jax.lra.data.listops_generator import generate
        >>> d = tempfile.mkdtemp()
        >>> _ = generate(d, num_train=4, num_val=2, num_test=2, min_length=10, max_length=40)
        >>> load(d, max_length=40).splits["train"].inputs.shape
        (4, 40)
    """
    max_length = check_positive_int("listops", "max_length", max_length)
    folder = _find_dir(Path(data_dir))
    splits, truncated = {}, {}
    for split, name in SPLIT_FILES.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"ListOps split file not found: {path}. Copy it from the LRA release's "
                f"listops-1000/ or regenerate with `spectral-jax data listops --out {folder}`."
            )
        seqs, labels = read_tsv(path)
        ids, mask, truncated[split] = pack(seqs, max_length)
        splits[split] = Split(ids, mask, labels)
    return Task("listops", VOCAB_SIZE, NUM_CLASSES, max_length, False, splits,
                source=f"ListOps TSV in {folder}", truncated=truncated)
