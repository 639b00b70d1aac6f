"""The common interface of every LRA task: a `Task` holding three fixed-shape `Split`s."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from spectral_jax import UsageError, UsageTypeError

SPLIT_NAMES = ("train", "validation", "test")
# The value of `Split.targets` at positions that carry no loss (PyTorch's ignore_index).
IGNORE_INDEX = -100
# The optional per-token arrays of a Split, each [N, L] like inputs, batched with them.
PER_TOKEN = ("targets", "segment_ids", "positions")


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a task as dense, fixed-length numpy arrays.

    Attributes:
        inputs: int32 [N, L] token ids, 0 = pad; [N, 2, L] for dual-document tasks
            (retrieval). For image tasks 0 is also the black pixel, so use `mask`, not
            `inputs > 0`, to find padding.
        mask: bool, same shape as `inputs`; True = valid token.
        labels: int32 [N] class ids.
        targets: None, or int32 [N, L] per-position targets of a causal model (tasks whose
            objective is ``"token_targets"``, e.g. MQAR): the id position t must predict,
            `IGNORE_INDEX` (-100) where no loss is taken.
        segment_ids, positions: None, or int32 [N, L] for rows of packed documents
            (:func:`spectral_jax.lra.data.packing.pack`): each token's document in its row
            (0: padding) and its position in that document; given together.

    Raises:
        spectral_jax.UsageTypeError: if an array has the wrong dtype.
        spectral_jax.UsageError: if the shapes disagree, `inputs` is not 2-D/3-D, or a target
            is negative and not `IGNORE_INDEX`.

    Example:
        >>> import numpy as np
        >>> s = Split(np.array([[3, 4, 0]], np.int32), np.array([[1, 1, 0]], bool),
        ...           np.array([1], np.int32))
        >>> len(s)
        1
    """

    inputs: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    targets: np.ndarray | None = None
    segment_ids: np.ndarray | None = None
    positions: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name, want in (("inputs", np.int32), ("mask", np.bool_), ("labels", np.int32),
                           ("targets", np.int32), ("segment_ids", np.int32),
                           ("positions", np.int32)):
            got = getattr(self, name)
            if name in PER_TOKEN and got is None:
                continue
            if not isinstance(got, np.ndarray) or got.dtype != want:
                raise UsageTypeError(
                    f"Split.{name} must be a numpy array of dtype {np.dtype(want).name}, "
                    f"got {type(got).__name__} {getattr(got, 'dtype', '')}"
                )
        if self.inputs.ndim not in (2, 3):
            raise UsageError(
                f"Split.inputs must be [N, L] or [N, 2, L], got shape {self.inputs.shape}"
            )
        if self.mask.shape != self.inputs.shape:
            raise UsageError(
                f"Split.mask shape {self.mask.shape} != inputs shape {self.inputs.shape}"
            )
        if self.labels.shape != self.inputs.shape[:1]:
            raise UsageError(
                f"Split.labels shape {self.labels.shape} must be ({self.inputs.shape[0]},)"
            )
        if self.labels.size and self.labels.min() < 0:
            raise UsageError(f"Split.labels must be >= 0, got minimum {self.labels.min()}")
        if self.targets is not None:
            if self.inputs.ndim != 2 or self.targets.shape != self.inputs.shape:
                raise UsageError(f"Split.targets shape {self.targets.shape} must be the [N, L] "
                                 f"shape of inputs, {self.inputs.shape}")
            bad = (self.targets < 0) & (self.targets != IGNORE_INDEX)
            if bad.any():
                raise UsageError(f"Split.targets must be >= 0 or IGNORE_INDEX ({IGNORE_INDEX}), "
                                 f"got {self.targets[bad][0]}")
        if (self.segment_ids is None) != (self.positions is None):
            raise UsageError("Split.segment_ids and Split.positions go together; got one.")
        for name in ("segment_ids", "positions"):
            got = getattr(self, name)
            if got is not None and got.shape != self.inputs.shape:
                raise UsageError(f"Split.{name} shape {got.shape} must be the shape of inputs, "
                                 f"{self.inputs.shape}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclasses.dataclass(frozen=True)
class Task:
    """A loaded LRA task: metadata plus its train / validation / test splits.

    Attributes:
        name: one of `spectral_jax.lra.data.TASKS`.
        vocab_size: number of token ids (ids are in [0, vocab_size)).
        num_classes: number of label classes (labels are in [0, num_classes)).
        max_length: sequence length L of every split (per document when `dual`).
        dual: True when inputs carry two documents ([N, 2, L]), i.e. retrieval.
        splits: {"train", "validation", "test"} -> `Split`.
        source: where the data was read from (path and format), for logs.
        truncated: split -> number of sequences longer than `max_length` that were cut
            (documents for retrieval, so up to 2 per example).

    Example:
        >>> import numpy as np
        >>> s = Split(np.zeros((2, 4), np.int32), np.ones((2, 4), bool), np.zeros(2, np.int32))
        >>> t = Task("image", 256, 10, 4, False, {"train": s, "validation": s, "test": s})
        >>> t.splits["train"].inputs.shape
        (2, 4)
    """

    name: str
    vocab_size: int
    num_classes: int
    max_length: int
    dual: bool
    splits: dict[str, Split]
    source: str = ""
    truncated: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.splits) != set(SPLIT_NAMES):
            raise UsageError(f"Task.splits must have keys {SPLIT_NAMES}, got {tuple(self.splits)}")
        want_ndim = 3 if self.dual else 2
        for key, split in self.splits.items():
            if split.inputs.ndim != want_ndim or split.inputs.shape[-1] != self.max_length:
                raise UsageError(
                    f"Task {self.name!r} split {key!r}: inputs shape {split.inputs.shape} does "
                    f"not match dual={self.dual}, max_length={self.max_length}"
                )


def majority_baseline(split: Split) -> float:
    """Accuracy of always predicting the most frequent label *of this split*.

    It is the fraction of `split`'s examples whose label equals its own most frequent
    label: an upper bound on any constant predictor on that split, i.e. the accuracy a
    model must beat to have learned anything beyond class frequencies.

    Args:
        split: a `Split` with int32 labels [N], N >= 1.

    Returns:
        A float in (0, 1].

    Raises:
        spectral_jax.UsageError: if the split is empty.

    Example:
        >>> import numpy as np
        >>> s = Split(np.zeros((4, 1), np.int32), np.ones((4, 1), bool),
        ...           np.array([0, 1, 1, 1], np.int32))
        >>> majority_baseline(s)
        0.75
    """
    if len(split) == 0:
        raise UsageError("majority_baseline: split is empty (N=0); it has no majority label")
    counts = np.bincount(split.labels)
    return float(counts.max() / len(split))
