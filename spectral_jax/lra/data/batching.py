"""Fixed-shape, resumable batches over a `Split`."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from spectral_jax import UsageError, _checks
from spectral_jax.lra.data.task import IGNORE_INDEX, PER_TOKEN, Split


def _epoch_order(n: int, epoch: int, shuffle: bool, seed: int) -> np.ndarray:
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng((seed, epoch)).permutation(n)


def iterate_batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    start_step: int = 0,
    repeat: bool = False,
    drop_remainder: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Yields fixed-shape batches; the order is a pure function of (seed, step).

    Epoch `e` visits the examples in the order `np.random.default_rng((seed, e))
    .permutation(N)` (or 0..N-1 when not shuffling).

    * `repeat=False` (evaluation): one pass over epoch 0, ceil(N / batch_size) batches.
      The last partial batch is padded to `batch_size` with rows of weight 0.0 (inputs 0,
      mask False, label 0) so every example is counted exactly once; with
      `drop_remainder=True` it is dropped instead.
    * `repeat=True` (training): the epochs are concatenated into one endless stream and
      step k takes stream positions [k*batch_size, (k+1)*batch_size), so every batch is
      full (weights all 1.0) and no example is ever skipped; a batch may straddle two
      epochs. `drop_remainder` has no effect.

    `start_step=k` yields exactly the batches steps k, k+1, ... of an uninterrupted run,
    which is what checkpoint resumption needs.

    Args:
        split: the `Split` to read (inputs [N, L] or [N, 2, L]).
        batch_size: rows per batch, >= 1.
        shuffle: permute each epoch with the seeded generator above.
        seed: shuffling seed.
        start_step: index of the first batch to yield, >= 0.
        repeat: loop forever over epochs 0, 1, 2, ...
        drop_remainder: without `repeat`, drop the last partial batch instead of padding.

    Yields:
        {"inputs": int32 [B, ...], "mask": bool [B, ...], "label": int32 [B],
         "weight": float32 [B] (1.0 real example, 0.0 padding row)}, and "targets",
        "segment_ids", "positions": int32 [B, L] when the split has them (`IGNORE_INDEX`,
        0 and 0 on padding rows).

    Raises:
        spectral_jax.UsageTypeError: if `batch_size` or `start_step` is not an int.
        spectral_jax.UsageError: if `batch_size` < 1, `start_step` < 0, `start_step` is past the end
            of a non-repeating pass, or `repeat=True` on an empty split.

    Example:
        >>> import numpy as np
        >>> from spectral_jax.lra.data.task import IGNORE_INDEX, Split
        >>> s = Split(np.arange(5, dtype=np.int32)[:, None], np.ones((5, 1), bool),
        ...           np.zeros(5, np.int32))
        >>> [b["weight"].tolist() for b in iterate_batches(s, 2, shuffle=False)]
        [[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]
    """
    batch_size = _checks.positive_int("iterate_batches", "batch_size", batch_size)
    start_step = _checks.nonnegative_int("iterate_batches", "start_step", start_step)
    n = len(split)
    if repeat:
        if n == 0:
            raise UsageError("iterate_batches: repeat=True needs a non-empty split, got N=0")
        yield from _repeating(split, batch_size, shuffle, seed, start_step)
        return
    num_batches = n // batch_size if drop_remainder else -(-n // batch_size)
    if start_step > num_batches:
        raise UsageError(
            f"iterate_batches: start_step={start_step} is past the end of one pass "
            f"({num_batches} batches of {batch_size} over N={n})"
        )
    order = _epoch_order(n, 0, shuffle, seed)
    for step in range(start_step, num_batches):
        idx = order[step * batch_size:(step + 1) * batch_size]
        yield gather(split, idx, batch_size)


def _repeating(
    split: Split, batch_size: int, shuffle: bool, seed: int, start_step: int
) -> Iterator[dict[str, np.ndarray]]:
    cache: dict[int, np.ndarray] = {}
    step = start_step
    while True:
        positions = np.arange(step * batch_size, (step + 1) * batch_size)
        yield gather(split, stream_indices(len(split), positions, shuffle, seed, cache),
                      batch_size)
        step += 1


def stream_indices(n: int, positions: np.ndarray, shuffle: bool, seed: int,
                   cache: dict[int, np.ndarray]) -> np.ndarray:
    """The examples at ``positions`` (increasing) of the endless stream of epochs, each
    epoch in the order of ``_epoch_order``; ``cache`` keeps the current epoch's order from
    call to call (only epochs at or after the first position's are kept)."""
    epochs = positions // n
    idx = np.empty(len(positions), np.int64)
    for e in np.unique(epochs).tolist():
        if e not in cache:
            for old in [k for k in cache if k < epochs[0]]:
                del cache[old]
            cache[e] = _epoch_order(n, e, shuffle, seed)
        sel = epochs == e
        idx[sel] = cache[e][positions[sel] % n]
    return idx


def gather(split: Split, idx: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
    k = idx.shape[0]
    inputs = np.zeros((batch_size,) + split.inputs.shape[1:], np.int32)
    mask = np.zeros((batch_size,) + split.mask.shape[1:], bool)
    label = np.zeros((batch_size,), np.int32)
    weight = np.zeros((batch_size,), np.float32)
    inputs[:k] = split.inputs[idx]
    mask[:k] = split.mask[idx]
    label[:k] = split.labels[idx]
    weight[:k] = 1.0
    batch = {"inputs": inputs, "mask": mask, "label": label, "weight": weight}
    for name in PER_TOKEN:
        values = getattr(split, name)
        if values is not None:  # padding rows: no target, segment 0, position 0
            batch[name] = np.full((batch_size,) + values.shape[1:],
                                  IGNORE_INDEX if name == "targets" else 0, np.int32)
            batch[name][:k] = values[idx]
    return batch
