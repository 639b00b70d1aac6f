"""Length-bucketed training batches: examples of similar length batched together, each
batch cut to its longest example, so that padding costs no compute."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from spectral_jax import UsageError, _checks
from spectral_jax.lra.data.batching import gather, stream_indices
from spectral_jax.lra.data.task import IGNORE_INDEX, PER_TOKEN, Split


def valid_lengths(split: Split) -> np.ndarray:
    """int ``(N,)``: one past each example's last valid token, target or segment (over every
    row of a pair): what a cut must keep."""
    mask = split.mask.reshape(len(split), -1, split.mask.shape[-1]).any(axis=1)
    if split.targets is not None:
        mask = mask | (split.targets != IGNORE_INDEX)
    if split.segment_ids is not None:
        mask = mask | (split.segment_ids != 0)
    last = mask.shape[-1] - np.argmax(mask[:, ::-1], axis=-1)
    return np.where(mask.any(axis=-1), last, 0)


def iterate_length_buckets(
    split: Split, batch_size: int, *, multiple: int, window: int, seed: int = 0,
    start_step: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """The training stream of ``iterate_batches(..., shuffle=True, repeat=True)``, batched by
    length; the order is a pure function of (seed, step).

    The stream is cut into windows of ``window`` batches (at most as many as one epoch
    fills, ``N // batch_size``, so that a window never holds two copies of an example). A
    window holds the same examples as those batches of the unbucketed stream (so every
    example is still seen once per epoch); they are sorted by valid length, cut into
    ``window`` batches of neighbours, and the batches are visited in an order drawn from
    (seed, window). Each batch is cut to its
    longest example rounded up to a multiple of ``multiple`` (at most the split's length),
    so a compiled step sees at most ⌈length / multiple⌉ shapes. About half of LRA
    ListOps' tokens are padding under one fixed length; in a bucket the padding is what the
    rounding leaves.

    Args:
        split: the training ``Split``.
        batch_size: rows per batch, >= 1.
        multiple: batch lengths are multiples of it, >= 1.
        window: batches sorted together, >= 1 (1: no sorting, only the cut).
        seed: shuffling seed, as in ``iterate_batches``.
        start_step: index of the first batch to yield, >= 0.

    Yields:
        The batches of ``iterate_batches``, with every per-token axis cut to the batch's
        length.

    Raises:
        spectral_jax.UsageError: a non-positive ``batch_size``, ``multiple`` or ``window``, a
          negative ``start_step``, or an empty split.
        spectral_jax.UsageTypeError: one of them is not an int.

    Example:
        >>> import itertools
        >>> import numpy as np
        >>> from spectral_jax.lra.data.task import Split
        >>> mask = np.arange(8)[None, :] < np.array([2, 8, 3, 7])[:, None]  # lengths
        >>> s = Split(np.ones((4, 8), np.int32), mask, np.zeros(4, np.int32))
        >>> batches = iterate_length_buckets(s, 2, multiple=4, window=2, seed=0)
        >>> sorted(b["mask"].shape for b in itertools.islice(batches, 2))  # {2, 3}, {7, 8}
        [(2, 4), (2, 8)]
    """
    owner = "iterate_length_buckets"
    batch_size = _checks.positive_int(owner, "batch_size", batch_size)
    multiple = _checks.positive_int(owner, "multiple", multiple)
    window = _checks.positive_int(owner, "window", window)
    start_step = _checks.nonnegative_int(owner, "start_step", start_step)
    if len(split) == 0:
        raise UsageError(f"{owner}: needs a non-empty split, got N=0")
    window = max(1, min(window, len(split) // batch_size))
    lengths = valid_lengths(split)
    full = split.mask.shape[-1]
    cache: dict[int, np.ndarray] = {}
    first = start_step // window
    for w in itertools.count(first):
        positions = np.arange(w * window * batch_size, (w + 1) * window * batch_size)
        idx = stream_indices(len(split), positions, True, seed, cache)
        # Sorted by length (stable, so equal lengths keep the stream's order), in batches.
        rows = idx[np.argsort(lengths[idx], kind="stable")].reshape(window, batch_size)
        visit = np.random.default_rng((seed, w, window)).permutation(window)
        for b in range(start_step - w * window if w == first else 0, window):
            batch_rows = rows[visit[b]]
            longest = int(lengths[batch_rows].max())
            cut = min(full, max(multiple, -(-longest // multiple) * multiple))
            yield _cut(gather(split, batch_rows, batch_size), cut)


def _cut(batch: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """``batch`` with its per-token arrays (inputs, mask and ``PER_TOKEN``) cut to
    ``length`` along their last axis."""
    return {name: value[..., :length] if name in ("inputs", "mask", *PER_TOKEN) else value
            for name, value in batch.items()}
