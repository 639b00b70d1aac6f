"""What a run's model learns: the task's objective, its model and its per-batch sums.

A task's registry entry names its objective (``TaskSpec.objective``). ``"classification"``
is the LRA classifiers' (:func:`spectral_jax.lra.train.steps.build_model`, cross-entropy of a
label per example); ``"next_token"`` is a causal language model
(:class:`spectral_jax.nn.CausalLM`) trained on every next token of its windows and
measured in bits per byte. An objective's metrics function has the signature of the
classifiers' ``(model, batch, deterministic) -> (loss, sums)``: the loop adds the sums over
batches and divides by ``count``, so ``loss`` and ``accuracy`` are per predicted token here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from spectral_jax.lra.data.registry import get_task_spec

CLASSIFICATION, NEXT_TOKEN = "classification", "next_token"
LN2 = math.log(2.0)


def task_objective(task: str) -> str:
    """The objective of registered task ``task``.

    Example:
        >>> task_objective("bytes_lm"), task_objective("listops")
        ('next_token', 'classification')
    """
    return get_task_spec(task).objective


def next_token_metrics(model: nnx.Module, batch: dict[str, jax.Array],
                       deterministic: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Next-token cross-entropy of a causal LM on windows of ``length + 1`` tokens.

    The model reads ``inputs[:, :-1]`` and is scored on ``inputs[:, 1:]`` where both are
    real tokens, weighted by the example's ``weight`` (0 for the padding rows of a last
    batch).

    Args:
        model: ``(batch, length) -> (batch, length, vocab)`` logits (``CausalLM``).
        batch: ``inputs`` int ``(B, L + 1)``, ``mask`` bool ``(B, L + 1)``, ``weight`` ``(B,)``.
        deterministic: no dropout.

    Returns:
        ``(mean loss in nats per target, sums)``; float32 sums ``loss_sum`` (nats),
        ``bits_sum`` (bits), ``correct`` (argmax hits), ``count`` (targets) and ``tokens``
        (the tokens read).

    Example:
        >>> import jax.numpy as jnp
        >>> class Uniform:
        ...     def __call__(self, x, deterministic):
        ...         return jnp.zeros(x.shape + (4,))
        >>> batch = {"inputs": jnp.array([[1, 2, 3, 0]]), "mask": jnp.array([[1, 1, 1, 0]]) > 0,
        ...          "weight": jnp.ones(1)}
        >>> loss, sums = next_token_metrics(Uniform(), batch, True)
        >>> float(sums["count"]), round(float(sums["bits_sum"] / sums["count"]), 4)
        (2.0, 2.0)
    """
    inputs, mask = batch["inputs"], batch["mask"]
    logits = model(inputs[:, :-1], deterministic=deterministic).astype(jnp.float32)
    targets = inputs[:, 1:]
    weight = (mask[:, 1:] & mask[:, :-1]).astype(jnp.float32) * batch["weight"][:, None]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    count = weight.sum()
    loss_sum = (losses * weight).sum()
    sums = {
        "loss_sum": loss_sum,
        "bits_sum": loss_sum / LN2,
        "correct": ((logits.argmax(-1) == targets) * weight).sum(),
        "count": count,
        "tokens": (mask[:, :-1] * batch["weight"][:, None]).sum(),
    }
    return loss_sum / jnp.maximum(count, 1.0), sums


def bits_per_byte(sums: dict[str, Any]) -> float:
    """``bits_sum / count`` of summed next-token metrics (the LM's bits per byte).

    Example:
        >>> bits_per_byte({"bits_sum": 3.0, "count": 2.0})
        1.5
    """
    return float(sums["bits_sum"]) / max(float(sums["count"]), 1.0)


def metrics_fn(objective: str) -> Callable[..., Any] | None:
    """The metrics function of ``objective``; None: the classifiers' own.

    Example:
        >>> metrics_fn("next_token") is next_token_metrics
        True
    """
    return next_token_metrics if objective == NEXT_TOKEN else None
