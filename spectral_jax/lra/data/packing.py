"""Packing variable-length sequences into fixed-length rows, with segment ids and positions.

Training on rows of one length pads every short example up to it; packing puts several
examples in one row instead, and the attention keeps them apart by their segment ids
(``segment_ids=`` of the attention functions, :class:`spectral_jax.nn.CausalLM`). Rows are
filled greedily, first fit: each sequence, in the order given, goes to the first row with
room for it (Krell et al. 2021, "Efficient sequence packing without cross-contamination",
discuss this and better packers; first fit in the given order keeps it deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from spectral_jax import UsageError, _checks


class Packed(NamedTuple):
    """Rows of packed sequences.

    Attributes:
      tokens: int32 ``(rows, length)``, ``pad_id`` where nothing was placed.
      segment_ids: int32 ``(rows, length)``: 1, 2, ... for the sequences of a row in the
        order they sit, 0 for padding.
      positions: int32 ``(rows, length)``: each token's index in its own sequence (0 on
        padding), for position embeddings and RoPE.
      placement: int ``(num_sequences, 2)``: the row and first column of each sequence, to
        lay out arrays aligned with the sequences (targets) the same way (:func:`lay_out`).
    """

    tokens: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    placement: np.ndarray

    @property
    def padding_fraction(self) -> float:
        """The share of the rows' slots that hold no token (0 when there are no rows)."""
        return float(np.mean(self.segment_ids == 0)) if self.segment_ids.size else 0.0


def pack(sequences: Sequence[np.ndarray], length: int, *, pad_id: int = 0) -> Packed:
    """Packs 1-D int sequences into rows of ``length`` tokens, first fit.

    Args:
      sequences: 1-D int arrays, each of 1 to ``length`` tokens.
      length: tokens per row.
      pad_id: the token written where nothing was placed.

    Returns:
      :class:`Packed`.

    Raises:
      spectral_jax.UsageError: ``length`` not a positive int; a sequence that is not 1-D
        int, empty or longer than ``length`` (cut long documents first).

    Example:
      >>> import numpy as np
      >>> from spectral_jax.lra.data.packing import pack
      >>> p = pack([np.array([5, 6, 7]), np.array([8, 9, 1, 2]), np.array([3])], 5)
      >>> p.tokens.tolist()
      [[5, 6, 7, 3, 0], [8, 9, 1, 2, 0]]
      >>> p.segment_ids.tolist(), p.positions.tolist()
      ([[1, 1, 1, 2, 0], [1, 1, 1, 1, 0]], [[0, 1, 2, 0, 0], [0, 1, 2, 3, 0]])
    """
    length = _checks.positive_int("pack()", "length", length)
    free: list[int] = []  # room left in each row
    sequences = [np.asarray(seq) for seq in sequences]
    placement = np.zeros((len(sequences), 2), np.int64)
    int32 = np.iinfo(np.int32)
    for i, seq in enumerate(sequences):
        if (seq.ndim != 1 or not 0 < seq.size <= length or not np.issubdtype(seq.dtype, np.integer)
                or seq.min() < int32.min or seq.max() > int32.max):
            raise UsageError(
                f"pack(): `sequences[{i}]` must be a 1-D int array of 1 to length={length} "
                f"int32 tokens; got {seq.dtype} of shape {seq.shape}.")
        room = np.flatnonzero(np.asarray(free, np.int64) >= seq.size) if free else ()
        row = int(room[0]) if len(room) else len(free)
        if row == len(free):
            free.append(length)
        placement[i] = (row, length - free[row])
        free[row] -= seq.size
    rows = len(free)
    tokens = np.full((rows, length), pad_id, np.int32)
    segment_ids = np.zeros((rows, length), np.int32)
    positions = np.zeros((rows, length), np.int32)
    count = np.zeros(rows, np.int32)
    for seq, (row, start) in zip(sequences, placement):
        end = start + len(seq)
        count[row] += 1
        tokens[row, start:end] = seq
        segment_ids[row, start:end] = count[row]
        positions[row, start:end] = np.arange(len(seq))
    return Packed(tokens, segment_ids, positions, placement)


def lay_out(sequences: Sequence[np.ndarray], packed: Packed, fill: int) -> np.ndarray:
    """Arrays aligned with the packed sequences (same lengths), placed as they were.

    Example:
      >>> import numpy as np
      >>> from spectral_jax.lra.data.packing import lay_out, pack
      >>> p = pack([np.array([5, 6]), np.array([7])], 4)
      >>> lay_out([np.array([6, 1]), np.array([2])], p, fill=-100).tolist()
      [[6, 1, 2, -100]]
    """
    sequences = [np.asarray(seq) for seq in sequences]
    if len(sequences) != len(packed.placement):
        raise UsageError(f"lay_out(): {len(sequences)} sequences for {len(packed.placement)} "
                         "packed ones; give one per packed sequence, in the same order.")
    out = np.full(packed.tokens.shape, fill, np.int32)
    for i, (seq, (row, start)) in enumerate(zip(sequences, packed.placement)):
        if seq.ndim != 1 or not np.issubdtype(seq.dtype, np.integer):
            raise UsageError(f"lay_out(): `sequences[{i}]` must be a 1-D int array; got "
                             f"{seq.dtype} of shape {seq.shape}.")
        placed = int(np.sum(packed.segment_ids[row] == packed.segment_ids[row, start]))
        if len(seq) != placed:
            raise UsageError(f"lay_out(): `sequences[{i}]` has {len(seq)} tokens; the packed "
                             f"sequence it is laid over has {placed}.")
        out[row, start:start + placed] = seq
    return out
