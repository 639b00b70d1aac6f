"""The keywords a drop-in attention function takes besides its own: Flax's ``attention_fn``
keywords and ``jax.nn.dot_product_attention``'s, named in each method's signature and checked
against what the method can honour."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention.core import _hints, _segments

# Keywords that Flax's ``attention_fn`` callers pass. The approximate methods form no
# attention-weight matrix, so they accept these but refuse dropout asked for and weights to
# sow. ``nnx.MultiHeadAttention`` always passes all of them.
FLAX_KWARGS = frozenset(
    {
        "dropout_rng",
        "dropout_rate",
        "broadcast_dropout",
        "deterministic",
        "dtype",
        "precision",
        "module",
    }
)
# ``jax.nn.dot_product_attention``'s keywords that every method takes, at least as None. A
# method that honours one declares it as its own parameter, so it never reaches **kwargs.
JAX_NN_KWARGS = frozenset({"implementation", "local_window_size"})
_DEFAULTS = {"dropout_rng": None, "dropout_rate": 0.0, "broadcast_dropout": True,
             "deterministic": False, "dtype": None, "precision": None, "module": None,
             "implementation": None, "local_window_size": None}

# The Args entries that read the same for every method: ``drop_in_signature`` adds each one
# whose parameter the function takes and whose docstring does not describe it already.
_SHARED_ARGS = (
    ("query_seq_lengths",
     "query_seq_lengths, key_value_seq_lengths: optional int ``(batch...,)``: how many\n"
     "  leading queries / keys of each example are valid (O(n) right padding, as in\n"
     "  ``jax.nn.dot_product_attention``), combined with ``mask`` by ``and``."),
    ("head_chunk_size",
     "head_chunk_size: (example, head) slices per step, each rematerialised in the\n"
     "  backward pass; None: about 4096 tokens' worth on CPU for long inputs, else all."),
    ("flax_kwargs",
     "**flax_kwargs: Flax ``attention_fn`` keywords, accepted; weight dropout asked for\n"
     "  (``dropout_rate > 0``, not ``deterministic``) raises NotImplementedError."),
)


def _with_shared_args(doc: str, parameters: Any) -> str:
    """``doc`` with the shared Args entries it lacks, placed before its ``Returns:``."""
    returns = re.search(r"^( *)Returns:", doc, re.M)
    if returns is None or re.search(r"^ *the rest: as", doc, re.M):  # it defers to another
        return doc
    indent = returns.group(1) + "  "
    entries = [entry for name, entry in _SHARED_ARGS if name in parameters
               and not re.search(rf"^ *\**{name}\b", doc, re.M)]
    if not entries:
        return doc
    lines = "".join(indent + line + "\n" for entry in entries for line in entry.split("\n"))
    # After the last Args entry: the blank line that ends the section.
    args = doc[:returns.start()].rstrip("\n ") + "\n"
    return args + lines + "\n" + doc[returns.start():]


def drop_in_signature(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Names Flax's and jax.nn's keywords in the signature of ``fn`` (which takes them
    through ``**flax_kwargs``).

    Linen's ``MultiHeadDotProductAttention`` passes its ``attention_fn`` only the keywords
    that ``inspect.signature`` lists by name, so a method that took dropout through
    ``**kwargs`` alone would never see Linen's ``dropout_rate`` and train without it. The
    docstring gains the Args entries that every method shares (``_SHARED_ARGS``) where it
    does not write its own.
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    var = [p for p in params if p.kind is p.VAR_KEYWORD]
    named = [p for p in params if p.kind is not p.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
             for name, default in _DEFAULTS.items() if name not in signature.parameters]
    fn.__signature__ = signature.replace(parameters=named + extra + var)
    if fn.__doc__:
        fn.__doc__ = _with_shared_args(fn.__doc__, signature.parameters)
    # What the function takes through **kwargs only (see _hints.functions_declaring).
    fn.drop_in_added = frozenset(p.name for p in extra)
    return fn


def check_flax_kwargs(method: str, kwargs: dict[str, Any], *, dropout_ok: bool = False) -> None:
    """Raises for keywords that are neither the method's nor Flax's nor jax.nn's, and for
    what the method cannot do.

    Attention-weight dropout asked for (``dropout_rate > 0`` and not ``deterministic``, as
    Flax's ``MultiHeadAttention(dropout_rate=...)`` does in training) and weights to sow
    (``module`` given: Flax's ``sow_weights=True``) raise unless the method implements them
    (``dropout_ok``): silently skipping them would make the training and evaluation paths
    the same. jax.nn's ``implementation`` must be None or ``"xla"`` and
    ``local_window_size`` None here: a method that honours them declares them itself.
    """
    _segments.refuse(method, kwargs)
    unknown = sorted(set(kwargs) - FLAX_KWARGS - JAX_NN_KWARGS - set(_segments.KEYWORDS))
    if unknown:
        raise UsageTypeError(
            f"{method}() got unexpected keyword argument(s) {unknown}; besides its own "
            f"parameters it accepts only Flax's attention_fn keywords {sorted(FLAX_KWARGS)} "
            f"and jax.nn.dot_product_attention's {sorted(JAX_NN_KWARGS)}."
        )
    if kwargs.get("implementation") not in (None, "xla"):
        raise UsageError(
            f"{method}(): `implementation` must be None or 'xla' (this method is written in "
            f"XLA operations); got {kwargs['implementation']!r}. Functions that take other "
            f"implementations: {_hints.functions_declaring('implementation')}.")
    if kwargs.get("local_window_size") is not None:
        raise UnsupportedError(
            f"{method}(): `local_window_size` must be None (this method has no sliding-"
            f"window form); got {kwargs['local_window_size']!r}. Functions that take a "
            f"window: {_hints.functions_declaring('local_window_size')}.")
    if not dropout_ok and kwargs.get("module") is not None:
        raise UnsupportedError(
            f"{method}(): sowing attention weights (Flax's sow_weights=True, which passes "
            "`module`) is not possible: this method never forms the attention-weight "
            "matrix. Call the module with sow_weights=False, or use "
            f"{_hints.functions_with('weight_dropout')}.")
    rate = kwargs.get("dropout_rate")
    # A rate traced under jit may be nonzero, so it counts as dropout asked for.
    asked = isinstance(rate, jax.core.Tracer) or (rate is not None and bool(np.any(rate != 0)))
    if not dropout_ok and asked and not kwargs.get("deterministic", False):
        raise UnsupportedError(
            f"{method}(): attention-weight dropout is not implemented (no weight matrix is "
            f"formed); got dropout_rate={rate!r} with deterministic="
            f"{kwargs.get('deterministic', False)!r}. Set the caller's dropout_rate to 0 "
            "(e.g. nnx.MultiHeadAttention(dropout_rate=0.0)), or use softmax_attention."
        )
