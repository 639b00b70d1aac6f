"""Registered attention methods bound to one compute budget, for benchmarking.

A benchmark needs each method as ``fn(query, key, value, state)`` with its budget fixed and its
random state (Performer features, Linformer projections, Skyformer's sampling key) passed as
an argument, so one compiled function serves every seed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.attention import ATTENTIONS, available_attentions, get_attention_spec

Array = jax.Array

# What one unit of "budget" means for each method (None: no budget), from the registry.
BUDGET_PARAMS: dict[str, str | None] = {name: spec.budget for name, spec in ATTENTIONS.items()}

LINFORMER_INITS = ("pool", "random")


def check_methods(names: Any) -> tuple[str, ...]:
    """Validates a list of registered method names and returns it as a tuple.

    Args:
      names: iterable of names from :func:`spectral_jax.attention.available_attentions`.

    Returns:
      The names, in the given order, without duplicates.

    Raises:
      spectral_jax.UsageError: an unknown name (the message lists the known ones) or an empty list.
      spectral_jax.UsageTypeError: ``names`` is a plain string rather than a list of strings.

    Example:
      >>> from spectral_jax.lra.bench.methods import check_methods
      >>> check_methods(["nystrom", "softmax"])
      ('nystrom', 'softmax')
    """
    if isinstance(names, str):
        raise UsageTypeError(f"`methods` must be a list of names, not the string {names!r}.")
    names = tuple(dict.fromkeys(names))
    if not names:
        raise UsageError(f"`methods` is empty; choose from {', '.join(available_attentions())}.")
    for name in names:
        get_attention_spec(name)
    return names


def has_budget(name: str) -> bool:
    """Whether ``name``'s accuracy and cost depend on a budget (landmarks, features, proj_len).

    Example:
      >>> from spectral_jax.lra.bench.methods import has_budget
      >>> has_budget("nystrom"), has_budget("linear")
      (True, False)
    """
    check_methods([name])
    return get_attention_spec(name).budget is not None


def _pool_projection(proj_len: int, length: int) -> Array:
    """Segment-mean pooling (proj_len, length): row c averages tokens ⌊c·n/k⌋..⌊(c+1)·n/k⌋-1."""
    seg = (jnp.arange(length) * proj_len) // length
    onehot = (seg[None, :] == jnp.arange(proj_len)[:, None]).astype(jnp.float32)
    return onehot / jnp.maximum(onehot.sum(axis=1, keepdims=True), 1.0)


def make_state(
    name: str,
    rng: Array,
    *,
    budget: int | None,
    length: int,
    head_dim: int,
    linformer_init: str = "pool",
) -> dict[str, Array]:
    """The random arrays ``name`` needs at this budget, as keyword arguments of its function.

    Args:
      name: a registered method name.
      rng: a ``jax.random`` key; each seed of a benchmark passes its own.
      budget: num_landmarks / num_features / proj_len (see ``BUDGET_PARAMS``); ignored by
        methods without a budget.
      length: sequence length n (Linformer's ``max_length``).
      head_dim: d (Performer's feature dimension).
      linformer_init: ``"pool"``: E = segment-mean pooling, a deterministic stand-in for a
        trained projection that becomes exact at proj_len = n; ``"random"``: the Xavier-
        uniform draw (gain 1/√2) that :func:`spectral_jax.nn.linformer_projection` starts from.

    Returns:
      ``{}``; or ``{"projection": float32 (budget, head_dim)}`` (Performer);
      ``{"key_projection": float32 (budget, length)}`` (Linformer); ``{"rng": key}`` (Skyformer).

    Raises:
      spectral_jax.UsageError: unknown ``name`` or ``linformer_init``, or a budget that is not a
        positive int for a method that needs one.

    Example:
      >>> import jax
      >>> from spectral_jax.lra.bench.methods import make_state
      >>> make_state("performer", jax.random.key(0), budget=16, length=64, head_dim=8)[
      ...     "projection"].shape
      (16, 8)
    """
    check_methods([name])
    if linformer_init not in LINFORMER_INITS:
        raise UsageError(
            f"`linformer_init` must be one of {LINFORMER_INITS}; got {linformer_init!r}."
        )
    spec = get_attention_spec(name)
    if spec.budget is None:
        return spec.make_state(rng, budget=None, length=length, head_dim=head_dim)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise UsageError(
            f"{name}: `budget` ({spec.budget}) must be a positive int; got {budget!r}.")
    if spec.state == "length_projection" and linformer_init == "pool":
        return {"key_projection": _pool_projection(budget, length)}
    return spec.make_state(rng, budget=budget, length=length, head_dim=head_dim)


def _apply(
    name: str, static: dict[str, Any], query: Array, key: Array, value: Array,
    state: dict[str, Array], mask: Array | None = None,
) -> Array:
    return get_attention_spec(name).fn(query, key, value, mask=mask, **static, **state)


def bind(name: str, budget: int | None = None, **static: Any) -> Callable[..., Array]:
    """``fn(query, key, value, state, mask=None)`` computing method ``name`` at ``budget``.

    Args:
      name: a registered method name.
      budget: the method's budget when it is a parameter of its function (num_landmarks);
        budgets that size a state (num_features, proj_len) go to :func:`make_state` instead.
        Ignored otherwise.
      **static: further keyword arguments of the method (e.g. ``shift="exact"``).

    Returns:
      A pure function of arrays ``(batch, n, heads, head_dim)``, the state dict from
      :func:`make_state` and an optional bool mask (True = attend), returning
      ``(batch, n, heads, v_head_dim)``; wrap it in ``jax.jit``.

    Raises:
      spectral_jax.UsageError: unknown ``name``.

    Example:
      >>> import jax
      >>> from spectral_jax.lra.bench.methods import bind, make_state
      >>> x = jax.random.normal(jax.random.key(0), (1, 64, 2, 8))
      >>> fn = bind("nystrom", 8)
      >>> fn(x, x, x, make_state("nystrom", jax.random.key(1), budget=8, length=64,
      ...                        head_dim=8)).shape
      (1, 64, 2, 8)
    """
    check_methods([name])
    spec = get_attention_spec(name)
    if budget is not None:  # a budget that is a parameter of the function (e.g. num_landmarks)
        static = {**spec.budget_kwargs(budget), **static}
    return functools.partial(_apply, name, static)
