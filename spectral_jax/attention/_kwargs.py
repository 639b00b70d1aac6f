"""The keywords a drop-in attention function takes besides its own: Flax's ``attention_fn``
keywords and ``jax.nn.dot_product_attention``'s, named in each method's signature and checked
against what the method can honour."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from spectral_jax import UnsupportedError, UsageError, UsageTypeError
from spectral_jax.attention import _hints, _segments

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


def drop_in_signature(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Names Flax's and jax.nn's keywords in the signature of ``fn`` (which takes them
    through ``**flax_kwargs``).

    Linen's ``MultiHeadDotProductAttention`` passes its ``attention_fn`` only the keywords
    that ``inspect.signature`` lists by name, so a method that took dropout through
    ``**kwargs`` alone would never see Linen's ``dropout_rate`` and train without it.
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    var = [p for p in params if p.kind is p.VAR_KEYWORD]
    named = [p for p in params if p.kind is not p.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
             for name, default in _DEFAULTS.items() if name not in signature.parameters]
    fn.__signature__ = signature.replace(parameters=named + extra + var)
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
