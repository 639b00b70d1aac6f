"""Multi-query associative recall (MQAR), Zoology's synthetic recall task, generated in memory.

Source: Arora, Eyuboglu, Timalsina, Johnson, Poli, Zou, Rudra and Ré, "Zoology: Measuring and
Improving Recall in Efficient Language Models" (arXiv:2312.04927, 2023): the task is the
paper's formalisation of associative recall with several queries per sequence; its
synthetic-data settings (vocabulary 8,192, lengths 64-512 with 4-64 pairs, power 0.01) are
those of the paper's Figure 2. The layout and sampling below follow the reference generator,
HazyResearch/zoology ``zoology/data/associative_recall.py`` (``multiquery_ar``, commit
``13e789b``; ``zoology/data/multiquery_ar.py`` today), for one example of length ``L`` with
``K`` pairs over a vocabulary of ``V`` ids:

1. Keys are ``K`` distinct ids from ``1 .. V//2 - 1``, values ``K`` distinct ids from
   ``V//2 .. V - 1`` (disjoint halves; id 0 is neither).
2. Positions ``0 .. 2K - 1`` hold ``key_1 value_1 ... key_K value_K``.
3. The rest holds ``S = (L - 2K) // 2`` query slots, slot ``s`` at position ``2K + 2s``. Slot
   ``s`` has weight ``a (s + 1)^(a - 1)`` (a power law: near queries are likelier); ``K``
   distinct slots are drawn one after another without replacement, the i-th receiving
   ``key_i``. Here the ordered draw uses the Gumbel-top-k trick (sorting ``log w + Gumbel``),
   which has the distribution of that sequential draw, vectorised over examples.
4. Every other position is filler: 0, or with ``random_non_queries`` a uniform id in
   ``[0, V)`` (which may repeat a key or a value by chance; it is never scored).
5. The target at a query's position is its key's value (the model reading the key must
   output the value); every other target is :data:`IGNORE_INDEX` (-100), so exactly ``K``
   positions per sequence carry loss and accuracy.

Example with ``L=16, K=2`` and filler 0 (ids made up)::

    inputs   17 4100  3 5000  0  0  3  0 17  0  0  0  0  0  0  0
    targets   .    .  .    .  .  . 5000 . 4100 .  .  .  .  .  .  .

The data is a pure function of its options: the splits are drawn from
``np.random.default_rng((seed, i))`` with ``i`` = 0, 1, 2 for train, validation and test (the
draws, in order: keys, values, slots, filler). Zoology's legacy ``np.random.seed`` draws are not
reproduced bit for bit; the distribution is the same. Zoology has a train and a test set and
stops on test accuracy; here validation and test are two independent draws.
"""

from __future__ import annotations

import os

import numpy as np

from spectral_jax import UsageError, _checks
from spectral_jax.lra.data.task import IGNORE_INDEX, SPLIT_NAMES, Split, Task

VOCAB_SIZE = 8192
# The (sequence length, pairs) cells of Zoology's Figure 2.
ZOOLOGY_PAIRS = {64: 4, 128: 8, 256: 16, 512: 64}
# Rows generated at once: bounds the [rows, S] Gumbel scores (at L=512: 8 MB).
_BLOCK = 4096
_OWNER = "mqar"


def check_sizes(seq_len: int, num_kv_pairs: int, vocab_size: int = VOCAB_SIZE) -> None:
    """Checks one MQAR shape: ``seq_len`` even, ``4 K <= seq_len < vocab_size`` (Zoology's).

    Raises:
        spectral_jax.UsageTypeError: a value that is not an int.
        spectral_jax.UsageError: a value out of its range (the message names the argument,
          the value and the range allowed).

    Example:
        >>> check_sizes(64, 16)
        >>> check_sizes(64, 17)
        Traceback (most recent call last):
        ...
        spectral_jax.UsageError: mqar: `num_kv_pairs` must be an int in [1, 16] (...); got 17.
    """
    for name, value in (("seq_len", seq_len), ("num_kv_pairs", num_kv_pairs),
                        ("vocab_size", vocab_size)):
        _checks.positive_int(_OWNER, name, value)
    if seq_len < 4 or seq_len % 2:
        raise UsageError(_checks.message(_OWNER, "seq_len", "an even int >= 4", seq_len))
    if num_kv_pairs > seq_len // 4:
        raise UsageError(_checks.message(
            _OWNER, "num_kv_pairs",
            f"an int in [1, {seq_len // 4}] (4 * num_kv_pairs <= seq_len={seq_len})",
            num_kv_pairs))
    if vocab_size <= seq_len:
        raise UsageError(_checks.message(
            _OWNER, "vocab_size", f"an int > seq_len={seq_len} (keys and values each take "
            "half of it)", vocab_size))


def _distinct(rng: np.random.Generator, rows: int, k: int, low: int, high: int) -> np.ndarray:
    """``[rows, k]`` ids, each row ``k`` distinct ids of ``[low, high)`` in random order.

    Floyd's algorithm gives a uniform ``k``-subset per row (one draw per column, vectorised
    over rows); a per-row permutation then makes the order uniform too.
    """
    n = high - low
    out = np.empty((rows, k), np.int64)
    for i, j in enumerate(range(n - k, n)):
        t = rng.integers(0, j + 1, size=rows)
        taken = (out[:, :i] == t[:, None]).any(axis=1)
        out[:, i] = np.where(taken, j, t)
    return rng.permuted(out, axis=1) + low


def _block(rng: np.random.Generator, rows: int, seq_len: int, k: int, vocab_size: int,
           log_weight: np.ndarray, random_non_queries: bool) -> tuple[np.ndarray, np.ndarray]:
    half = vocab_size // 2
    keys = _distinct(rng, rows, k, 1, half)
    values = _distinct(rng, rows, k, half, vocab_size)
    scores = log_weight + rng.gumbel(size=(rows, log_weight.size))
    slots = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # the i-th drawn slot: key i
    inputs = np.zeros((rows, seq_len), np.int32)
    targets = np.full((rows, seq_len), IGNORE_INDEX, np.int32)
    inputs[:, 0:2 * k:2] = keys
    inputs[:, 1:2 * k:2] = values
    where = 2 * k + 2 * slots
    np.put_along_axis(inputs, where, keys, axis=1)
    np.put_along_axis(targets, where, values, axis=1)
    if random_non_queries:
        filler = rng.integers(0, vocab_size, size=(rows, seq_len), dtype=np.int32)
        inputs = np.where(inputs == 0, filler, inputs)
    return inputs, targets


def generate(
    num_examples: int,
    *,
    seq_len: int = 64,
    num_kv_pairs: int = 4,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    seed: int | np.random.Generator = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """MQAR sequences and their targets (layout and sampling in the module docstring).

    Args:
        num_examples: N, the number of sequences, >= 1.
        seq_len: L, even, >= 4 (Zoology: 64-512).
        num_kv_pairs: K, the pairs and queries per sequence, ``1 <= K <= L // 4``
          (Zoology: 4-64).
        vocab_size: V, ``> L``; keys come from ``[1, V//2)``, values from ``[V//2, V)``.
        power_a: the power law's ``a`` in ``(0, 1]``: 0.01 (Zoology) puts queries near the
          context, 1 spreads them uniformly over the slots.
        random_non_queries: filler of uniform ids in ``[0, V)`` instead of 0 (Zoology's class
          default; its Figure 2 runs use 0).
        seed: an int >= 0 for ``np.random.default_rng(seed)``, or a Generator to draw from.

    Returns:
        ``(inputs, targets)``, both int32 ``[N, L]``: ``targets`` holds the paired value at
        the K query positions of each row and :data:`IGNORE_INDEX` (-100) elsewhere.

    Raises:
        spectral_jax.UsageTypeError: an argument of the wrong kind (a float length, ...).
        spectral_jax.UsageError: an argument out of range (the message names it, its value
          and the range allowed).

    Example:
        >>> inputs, targets = generate(2, seq_len=16, num_kv_pairs=2, vocab_size=32, seed=1)
        >>> inputs.shape, targets.dtype.name, (targets >= 0).sum(axis=1).tolist()
        ((2, 16), 'int32', [2, 2])
        >>> row, pos = 0, int(np.flatnonzero(targets[0] >= 0)[0])
        >>> key = inputs[row, pos]  # the query: a key from the context block
        >>> pair = int(np.flatnonzero(inputs[row, :4] == key)[0])
        >>> bool(targets[row, pos] == inputs[row, pair + 1])  # the answer: the key's value
        True
    """
    num_examples = _checks.positive_int(_OWNER, "num_examples", num_examples)
    check_sizes(seq_len, num_kv_pairs, vocab_size)
    power_a = _checks.number(_OWNER, "power_a", power_a, low=0.0, high=1.0, low_open=True)
    random_non_queries = _checks.boolean(_OWNER, "random_non_queries", random_non_queries)
    if not isinstance(seed, np.random.Generator):
        seed = _checks.nonnegative_int(_OWNER, "seed", seed)
    rng = np.random.default_rng(seed)
    slots = (seq_len - 2 * num_kv_pairs) // 2
    log_weight = (power_a - 1.0) * np.log(np.arange(1, slots + 1))  # log a dropped: a constant
    parts = [_block(rng, min(_BLOCK, num_examples - start), seq_len, num_kv_pairs, vocab_size,
                    log_weight, random_non_queries)
             for start in range(0, num_examples, _BLOCK)]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def make_split(inputs: np.ndarray, targets: np.ndarray) -> Split:
    """A :class:`Split` of generated MQAR arrays: every position valid, ``targets`` kept.

    A row's ``label`` is its first answer in sequence order, so the split's majority
    baseline is the accuracy of always giving the most frequent answer.

    Example:
        >>> split = make_split(*generate(3, seq_len=16, num_kv_pairs=2, vocab_size=32))
        >>> bool(split.mask.all()), split.labels.shape, bool((split.labels >= 16).all())
        (True, (3,), True)
    """
    first = np.argmax(targets != IGNORE_INDEX, axis=1)
    labels = targets[np.arange(len(targets)), first].astype(np.int32)
    return Split(inputs, np.ones(inputs.shape, bool), labels, targets)


def load(
    data_dir: str | os.PathLike | None = None,
    *,
    seq_len: int = 64,
    num_kv_pairs: int = 4,
    vocab_size: int = VOCAB_SIZE,
    num_train: int = 100_000,
    num_val: int = 3_000,
    num_test: int = 3_000,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    seed: int = 0,
) -> Task:
    """The MQAR task: three splits generated in memory (nothing is read from ``data_dir``).

    Defaults are Zoology's Figure 2 at ``L=64``: vocabulary 8,192, 4 pairs, 100,000 training
    and 3,000 held-out sequences, ``a = 0.01``, filler 0.

    Args:
        data_dir: not read (the task keeps the reader signature of every task).
        seq_len, num_kv_pairs, vocab_size, power_a, random_non_queries: as for
          :func:`generate`.
        num_train, num_val, num_test: sequences per split, each >= 1.
        seed: split ``i`` (train, validation, test) is drawn from
          ``np.random.default_rng((seed, i))``.

    Returns:
        Task ``"mqar"``: inputs, targets int32 ``[N, L]`` (``Split.targets``), mask all True,
        ``vocab_size = num_classes = V``, ``max_length = L``.

    Raises:
        spectral_jax.UsageTypeError, spectral_jax.UsageError: a bad option (named with its
          value and allowed range).

    Example:
        >>> task = load(seq_len=16, num_kv_pairs=2, vocab_size=32, num_train=5, num_val=2,
        ...             num_test=2)
        >>> task.splits["train"].targets.shape, task.vocab_size, task.max_length
        ((5, 16), 32, 16)
    """
    seed = _checks.nonnegative_int(_OWNER, "seed", seed)
    sizes = {}
    for split, name, value in zip(SPLIT_NAMES, ("num_train", "num_val", "num_test"),
                                  (num_train, num_val, num_test)):
        sizes[split] = _checks.positive_int(_OWNER, name, value)
    options = dict(seq_len=seq_len, num_kv_pairs=num_kv_pairs, vocab_size=vocab_size,
                   power_a=power_a, random_non_queries=random_non_queries)
    splits = {split: make_split(*generate(sizes[split], seed=np.random.default_rng((seed, i)),
                                          **options))
              for i, split in enumerate(SPLIT_NAMES)}
    source = (f"generated MQAR (Zoology): L={seq_len}, K={num_kv_pairs}, V={vocab_size}, "
              f"a={power_a}, {'random' if random_non_queries else 'zero'} filler, seed {seed}")
    return Task("mqar", vocab_size, vocab_size, seq_len, False, splits, source=source)
