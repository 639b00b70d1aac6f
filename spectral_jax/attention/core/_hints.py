"""Sentences naming registered methods, for the error messages of the method files.

The method files sit below the registry (it imports them), so they cannot import it. The
registry fills :data:`REGISTERED` once it has built its table; the hints read it when an
error is raised, by which time ``spectral_jax.attention`` has finished importing.
"""

from __future__ import annotations

import inspect
from typing import Any

# name -> AttentionSpec, filled by spectral_jax.attention._registry at import.
REGISTERED: dict[str, Any] = {}


def registered(function: str) -> Any | None:
    """The ``AttentionSpec`` whose ``fn`` is named ``function``, or None (not a registered
    method, e.g. a building block such as ``luna_pack``).

    Example:
      >>> registered("linear_attention").name, registered("luna_pack")
      ('linear', None)
    """
    return next((s for s in REGISTERED.values() if s.fn.__name__ == function), None)


def functions_with(flag: str) -> str:
    """The registered functions whose ``AttentionSpec`` field ``flag`` is true, comma-separated.

    Example:
      >>> functions_with("cached_decode").split(", ")[0]
      'softmax_attention'
    """
    return ", ".join(spec.fn.__name__ for spec in REGISTERED.values() if getattr(spec, flag))


def functions_declaring(keyword: str) -> str:
    """The registered functions that declare ``keyword`` as their own parameter (rather
    than take it, as jax.nn's or Flax's keyword, only to refuse it), as "a, b and c".

    Example:
      >>> functions_declaring("local_window_size")
      'softmax_attention and local_attention'
    """
    names = [spec.fn.__name__ for spec in REGISTERED.values()
             if keyword in inspect.signature(spec.fn).parameters
             and keyword not in getattr(spec.fn, "drop_in_added", frozenset())]
    return " and ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))


def causal_methods_hint() -> str:
    """One sentence naming every registered function with a causal form, for error messages.

    Example:
      >>> causal_methods_hint().startswith("Functions with a causal form: softmax_attention, ")
      True
    """
    return f"Functions with a causal form: {functions_with('supports_causal')}."


def cached_decode_hint() -> str:
    """One sentence naming every registered function that decodes from a cache.

    Example:
      >>> cached_decode_hint().startswith("Functions that decode from a key/value cache: ")
      True
    """
    return f"Functions that decode from a key/value cache: {functions_with('cached_decode')}."


def functions_splitting(argument: str) -> str:
    """The registered functions whose registry ``token_arrays`` split ``argument`` with the
    tokens on a sequence split over devices, comma-separated.

    Example:
      >>> functions_splitting("segment_ids").split(", ")[:3]
      ['softmax_attention', 'linear_attention', 'performer_attention']
    """
    return ", ".join(spec.fn.__name__ for spec in REGISTERED.values()
                     if any(arg == argument for arg, *_ in spec.token_arrays))
