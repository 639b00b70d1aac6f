"""Packing variable-length token sequences into fixed [N, L] arrays; byte-level ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spectral_jax import _checks

BYTE_VOCAB_SIZE = 257  # UTF-8 byte b -> id b + 1; 0 is padding (LRA's ByteTextEncoder).


def encode_bytes(data: bytes) -> np.ndarray:
    """Byte-level token ids of `data`: byte b -> b + 1, as in LRA's `ByteTextEncoder`.

    Args:
        data: raw (UTF-8) bytes.

    Returns:
        int32 [len(data)] ids in [1, 256].

    Example:
        >>> encode_bytes(b"Hi").tolist()
        [73, 106]
    """
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32) + 1


def pack(sequences: Sequence[np.ndarray], max_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Truncates or zero-pads each 1-D id sequence to `max_length` and stacks them.

    Args:
        sequences: N int arrays of any length (ids must be >= 1; 0 is reserved for pad).
        max_length: L, the output length, >= 1.

    Returns:
        (ids int32 [N, L], mask bool [N, L] True on real tokens, number of sequences
        longer than L that were truncated).

    Example:
        >>> ids, mask, cut = pack([np.array([5, 6, 7]), np.array([8])], 2)
        >>> ids.tolist(), mask.tolist(), cut
        ([[5, 6], [8, 0]], [[True, True], [True, False]], 1)
    """
    lengths = np.fromiter((len(s) for s in sequences), np.int64, count=len(sequences))
    ids = np.zeros((len(sequences), max_length), np.int32)
    for row, seq in zip(ids, sequences):
        row[: min(len(seq), max_length)] = seq[:max_length]
    mask = np.arange(max_length)[None, :] < lengths[:, None]
    return ids, mask, int((lengths > max_length).sum())


def check_positive_int(owner: str, name: str, value: object) -> int:
    """Returns `value` as int, or raises naming `owner` and `name` (see `spectral_jax._checks`).

    Raises:
        spectral_jax.UsageTypeError: if `value` is not an int (a bool or a float), which is
            also a ValueError.
        spectral_jax.UsageError: if `value` < 1.

    Example:
        >>> check_positive_int("text", "max_length", 4000)
        4000
    """
    return _checks.positive_int(owner, name, value)
