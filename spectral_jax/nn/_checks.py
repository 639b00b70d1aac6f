"""Argument checks shared by the NNX modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spectral_jax import _checks


def check_positive_int(name: str, value: Any) -> None:
    """Raises ValueError naming ``name`` unless ``value`` is an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")


def normalise_attention_kwargs(owner: str, value: Any, *,
                               hashed: bool = True) -> tuple[tuple[str, Any], ...]:
    """``attention_kwargs`` in its one stored form: ``(name, value)`` pairs sorted by name.

    Every module and config takes a mapping (``{"num_landmarks": 64}``); a sequence of
    ``(name, value)`` pairs is accepted too. The stored form is hashable, so a frozen config
    or a module's static data that holds it can be hashed (one jit cache entry), and it is
    the same for the same contents in any form or order.

    Args:
        owner: who asks, for the message (``"TransformerConfig"``).
        value: a mapping of str to hashable values, a sequence of ``(str, value)`` pairs, or
          None (none).
        hashed: check that every value is hashable; False leaves it to a later
          :func:`check_hashable` (after the names have been checked against the method).

    Returns:
        A tuple of ``(name, value)`` pairs sorted by name.

    Raises:
        TypeError: neither a mapping nor pairs; a name that is not a str; a value that is not
          hashable (e.g. a list: give a tuple).
        ValueError: a name given twice among pairs.

    Example:
        >>> normalise_attention_kwargs("f()", {"num_landmarks": 8, "conv_kernel_size": 3})
        (('conv_kernel_size', 3), ('num_landmarks', 8))
        >>> normalise_attention_kwargs("f()", [("num_landmarks", 8)])
        (('num_landmarks', 8),)
    """
    what = "a mapping of parameter names to values, e.g. {'num_landmarks': 64}"
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)) and all(
            isinstance(item, (tuple, list)) and len(item) == 2 for item in value):
        items = [tuple(item) for item in value]
    else:
        raise TypeError(_checks.message(owner, "attention_kwargs", what, value))
    seen = set()
    for name, item in items:
        if not isinstance(name, str):
            raise TypeError(_checks.message(owner, "attention_kwargs", what + " (str names)",
                                            value))
        if name in seen:
            raise ValueError(_checks.message(owner, "attention_kwargs",
                                             "pairs with distinct names", value))
        seen.add(name)
    pairs = tuple(sorted(items, key=lambda pair: pair[0]))
    if hashed:
        check_hashable(owner, pairs)
    return pairs


def check_hashable(owner: str, pairs: tuple[tuple[str, Any], ...]) -> None:
    """Raises TypeError naming the first ``attention_kwargs`` value that cannot be hashed."""
    for name, item in pairs:
        try:
            hash(item)
        except TypeError:
            raise TypeError(_checks.message(
                owner, f"attention_kwargs[{name!r}]",
                "hashable (a number, str, bool, None or tuple), as configs and modules are "
                "hashed", item)) from None
