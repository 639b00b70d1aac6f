"""ListOps generation with LRA's algorithm, and an evaluator independent of the generator.

Sources: Nangia & Bowman 2018 (ListOps); Tay et al. 2021 (LRA), generator
`google-research/long-range-arena: lra_benchmarks/data/listops.py`. The release format and its
reader are in :mod:`spectral_jax.lra.data.listops`.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import numpy as np

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.lra.data.listops import (
    END,
    NUM_CLASSES,
    OPERATORS,
    SPLIT_FILES,
    tokenize,
)
from spectral_jax.lra.data.tokens import check_positive_int

_LEAF_PROB = 0.75  # LRA's VALUE_P = 0.25 is the probability of an operator node.


def evaluate(expression: str) -> int:
    """Value (0-9) of a ListOps expression, by a recursive parse of its tokens.

    MIN, MAX as usual; MED = int(numpy.median(args)) (even count: the mean of the two
    middle values, truncated); SM = sum mod 10. This is independent of the generator's
    vectorised labelling and is used to check it.

    Args:
        expression: parenthesised (release) or plain form.

    Returns:
        The int value in [0, 9].

    Raises:
        spectral_jax.UsageError: on an unknown token, an operator without arguments, a missing or
            extra `]`, or trailing tokens.

    Example:
        >>> evaluate("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]")
        5
    """
    toks = tokenize(expression)
    if not toks:
        raise UsageError(f"evaluate: empty expression {expression!r}")
    value, end = _parse(toks, 0, expression)
    if end != len(toks):
        raise UsageError(f"evaluate: trailing tokens {toks[end:]} in {expression!r}")
    return value


def _parse(toks: list[str], i: int, expression: str) -> tuple[int, int]:
    tok = toks[i]
    if tok.isdigit() and len(tok) == 1:
        return int(tok), i + 1
    if tok not in OPERATORS:
        raise UsageError(f"evaluate: unexpected token {tok!r} at position {i} in {expression!r}")
    args: list[int] = []
    i += 1
    while i < len(toks) and toks[i] != END:
        value, i = _parse(toks, i, expression)
        args.append(value)
    if i == len(toks):
        raise UsageError(f"evaluate: missing ']' for {tok} in {expression!r}")
    if not args:
        raise UsageError(f"evaluate: {tok} has no arguments in {expression!r}")
    return _apply(tok, args), i + 1


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    s = sorted(args)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2


def _max_tree_length(max_depth: int, max_args: int) -> int:
    length = 1
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _sample_batch(
    rng: np.random.Generator, n: int, min_length: int, max_length: int, max_depth: int,
    max_args: int,
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Samples `n` LRA trees level by level; returns the accepted ones in draw order.

    Returns (release-format sources, int labels, tokenised lengths).
    """
    levels = []  # per depth: (tree, parent, is_op, k, op, digit), children grouped by parent
    tree, parent = np.arange(n), np.full(n, -1)
    length = np.zeros(n, np.int64)
    dead = np.zeros(n, bool)
    for depth in range(1, max_depth + 1):
        m = tree.size
        if m == 0:
            break
        is_op = rng.random(m) < 1 - _LEAF_PROB if depth < max_depth else np.zeros(m, bool)
        num_ops = int(is_op.sum())
        k, op, digit = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64)
        k[is_op] = rng.integers(2, max_args + 1, num_ops)
        op[is_op] = rng.integers(0, len(OPERATORS), num_ops)
        digit[~is_op] = rng.integers(0, 10, m - num_ops)
        levels.append((tree, parent, is_op, k, op, digit))
        length += np.bincount(tree, weights=1 + is_op, minlength=n).astype(np.int64)
        # Each pending child adds >= 1 token, so a tree can be dropped as soon as this
        # lower bound reaches max_length: it keeps the heavy tail from blowing up.
        dead |= length + np.bincount(tree, weights=k, minlength=n) >= max_length
        child_tree = np.repeat(tree, k)
        keep = ~dead[child_tree]
        tree, parent = child_tree[keep], np.repeat(np.arange(m), k)[keep]
    accepted = ~dead & (length > min_length) & (length < max_length)
    if not accepted.any():
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    tree_index = np.cumsum(accepted) - 1
    kept, prev_index = [], None
    for tree, parent, is_op, k, op, digit in levels:
        sel = accepted[tree]
        if not sel.any():
            break
        par = prev_index[parent[sel]] if prev_index is not None else parent[sel]
        kept.append((tree_index[tree[sel]], par, is_op[sel], k[sel], op[sel], digit[sel]))
        prev_index = np.cumsum(sel) - 1
    sizes, values = _sizes_and_values(kept)
    return _render(kept, sizes, max_args), values[0], sizes[0]


def _sizes_and_values(levels: list) -> tuple[list[np.ndarray], list[np.ndarray]]:
    sizes: list[np.ndarray] = [None] * len(levels)  # type: ignore[list-item]
    values: list[np.ndarray] = [None] * len(levels)  # type: ignore[list-item]
    for d in range(len(levels) - 1, -1, -1):
        _, _, is_op, k, op, digit = levels[d]
        size, value = np.ones(is_op.size, np.int64), digit.astype(np.int64)
        if is_op.any():
            child_parent, child_size, child_val = levels[d + 1][1], sizes[d + 1], values[d + 1]
            child_sum = np.bincount(child_parent, child_size, is_op.size).astype(np.int64)
            size += np.where(is_op, 1 + child_sum, 0)
            starts, ks = (np.cumsum(k) - k)[is_op], k[is_op]
            ordered = child_val[np.lexsort((child_val, child_parent))]
            candidates = np.stack([
                np.minimum.reduceat(child_val, starts),
                np.maximum.reduceat(child_val, starts),
                (ordered[starts + (ks - 1) // 2] + ordered[starts + ks // 2]) // 2,
                np.add.reduceat(child_val, starts) % 10,
            ])
            value[is_op] = candidates[op[is_op], np.arange(ks.size)]
        sizes[d], values[d] = size, value
    return sizes, values


def _render(levels: list, sizes: list[np.ndarray], max_args: int) -> list[str]:
    # Release form: an operator with k arguments is "( " * (k + 1) + op, every argument
    # is followed by " )", and "]" by " )" (plus " )" when it closes an argument).
    table = [("( " * (k + 1)) + o for o in OPERATORS for k in range(max_args + 1)]
    digit_arg, digit_root = len(table), len(table) + 10
    table += [f"{d} )" for d in range(10)] + [str(d) for d in range(10)]
    end_arg, end_root = len(table), len(table) + 1
    table += ["] ) )", "] )"]
    root_size = sizes[0]
    base = np.cumsum(root_size) - root_size
    codes = np.empty(int(root_size.sum()), np.int64)
    offset = np.zeros(root_size.size, np.int64)  # position of each node inside its tree
    for d, (tree, parent, is_op, k, op, digit) in enumerate(levels):
        if d > 0:
            # A child starts after its parent's operator token and its earlier siblings.
            prev_k = levels[d - 1][3]
            group_start = (np.cumsum(prev_k) - prev_k)[parent]
            before = np.cumsum(sizes[d]) - sizes[d]
            offset = offset[parent] + 1 + before - before[group_start]
        pos = base[tree] + offset
        codes[pos[is_op]] = op[is_op] * (max_args + 1) + k[is_op]
        codes[(pos + sizes[d] - 1)[is_op]] = end_root if d == 0 else end_arg
        codes[pos[~is_op]] = digit[~is_op] + (digit_root if d == 0 else digit_arg)
    words = np.array(table, dtype=object)[codes].tolist()
    return [" ".join(words[b:b + s]) for b, s in zip(base.tolist(), root_size.tolist())]


def generate(
    out_dir: str | os.PathLike,
    *,
    num_train: int = 96000,
    num_val: int = 2000,
    num_test: int = 2000,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
) -> dict:
    """Generates ListOps with LRA's algorithm and writes `basic_{train,val,test}.tsv`.

    Trees follow `lra_benchmarks/data/listops.py`: the root is at depth 1; a node is an
    operator (uniform over MIN, MAX, MED, SM) with probability 0.25 while depth <
    max_depth, else a digit 0-9; an operator has randint(2, max_args) arguments. Like
    LRA only trees with `min_length < tokens < max_length` (strict, tokens counted after
    tokenisation, brackets `]` included) are kept, duplicates are removed (so the splits
    are disjoint), and the first `num_train` go to train, then val, then test. The
    sampling is vectorised over thousands of trees per level and hopeless trees are
    pruned early, so the 96k default set takes well under a minute.

    Files: TSV with header `Source\\tTarget` written by `csv.writer(delimiter="\\t")`,
    Source in the release's parenthesised form, Target the value from a vectorised
    evaluation (tests check it against `evaluate`).

    Args:
        out_dir: directory to create/fill (files are overwritten).
        num_train, num_val, num_test: split sizes (>= 1 each).
        seed: numpy seed; the same arguments give byte-identical files.
        min_length, max_length: exclusive token-length bounds (0 <= min < max - 1).
        max_depth: maximum tree depth (>= 1); max_args: maximum arguments (>= 2).

    Returns:
        Stats: {"train", "validation", "test": counts, "seconds", "candidates" (trees
        drawn), "duplicates", "truncated" (always 0: no tree reaches max_length),
        "min_tokens", "mean_tokens", "max_tokens", "label_counts", "files"}.

    Raises:
        TypeError / ValueError: on a bad argument (message names it), including lengths
            no tree of `max_depth` / `max_args` can reach, or too few distinct trees.

    Example:
        >>> import tempfile
        >>> stats = generate(tempfile.mkdtemp(), num_train=8, num_val=2, num_test=2,
        ...                  min_length=10, max_length=40)
        >>> stats["train"], stats["truncated"]
        (8, 0)
    """
    start = time.perf_counter()
    counts = {
        "train": check_positive_int("listops.generate", "num_train", num_train),
        "validation": check_positive_int("listops.generate", "num_val", num_val),
        "test": check_positive_int("listops.generate", "num_test", num_test),
    }
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"listops.generate: seed must be an int >= 0, got {seed!r}")
    max_depth = check_positive_int("listops.generate", "max_depth", max_depth)
    max_args = check_positive_int("listops.generate", "max_args", max_args)
    max_length = check_positive_int("listops.generate", "max_length", max_length)
    if max_args < 2:
        raise UsageError(f"listops.generate: max_args must be >= 2, got {max_args}")
    if isinstance(min_length, bool) or not isinstance(min_length, (int, np.integer)):
        raise UsageTypeError(f"listops.generate: min_length must be an int, got {min_length!r}")
    if not 0 <= min_length < max_length - 1:
        raise UsageError(
            f"listops.generate: need 0 <= min_length < max_length - 1 (bounds are "
            f"exclusive), got min_length={min_length}, max_length={max_length}"
        )
    longest = _max_tree_length(max_depth, max_args)
    if longest <= min_length:
        raise UsageError(
            f"listops.generate: min_length={min_length} is unreachable: trees with "
            f"max_depth={max_depth}, max_args={max_args} have at most {longest} tokens"
        )
    total = sum(counts.values())
    rng = np.random.default_rng(seed)
    found: dict[str, tuple[int, int]] = {}
    candidates = duplicates = 0
    batch_cap = int(np.clip(40_000_000 // max_length, 256, 65536))
    batch = min(4096, batch_cap)
    stalled = 0  # draws since the last new distinct tree
    while len(found) < total:
        if stalled > 500_000 or candidates > max(10_000_000, 2000 * total):
            raise UsageError(
                f"listops.generate: only {len(found)} distinct trees of {total} found in "
                f"{candidates} draws; widen min_length={min_length}..max_length={max_length}"
                f" or raise max_depth={max_depth} / max_args={max_args}"
            )
        sources, labels, lengths = _sample_batch(
            rng, batch, min_length, max_length, max_depth, max_args
        )
        candidates += batch
        before = len(found)
        for src, y, n in zip(sources, labels.tolist(), lengths.tolist()):
            if src in found:
                duplicates += 1
            elif len(found) < total:
                found[src] = (y, n)
        stalled = 0 if len(found) > before else stalled + batch
        rate = max(len(found), 1) / candidates
        batch = int(np.clip(1.2 * (total - len(found)) / rate, 256, batch_cap))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = list(found.items())
    files, begin = [], 0
    for split, count in counts.items():
        path = out / SPLIT_FILES[split]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t")
            writer.writerow(["Source", "Target"])
            writer.writerows((src, y) for src, (y, _) in items[begin:begin + count])
        files.append(str(path))
        begin += count
    lengths = np.array([n for _, (_, n) in items])
    labels = np.array([y for _, (y, _) in items])
    return {
        **counts,
        "seconds": time.perf_counter() - start,
        "candidates": candidates,
        "duplicates": duplicates,
        "truncated": 0,
        "min_tokens": int(lengths.min()),
        "mean_tokens": float(lengths.mean()),
        "max_tokens": int(lengths.max()),
        "label_counts": np.bincount(labels, minlength=NUM_CLASSES).tolist(),
        "files": files,
    }
