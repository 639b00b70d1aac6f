"""What a run's model learns: the task's objective, its model and its per-batch sums.

A task's registry entry names its objective (``TaskSpec.objective``). ``"classification"``
is the LRA classifiers' (:func:`spectral_jax.lra.train.steps.build_model`, cross-entropy of a
label per example); ``"next_token"`` is a causal language model
(:class:`spectral_jax.nn.CausalLM`) trained on every next token of its windows and
measured in bits per byte; ``"token_targets"`` is the same model trained and scored only at
the positions whose target is set (``Split.targets`` other than ``IGNORE_INDEX``: the
answers of MQAR, :mod:`spectral_jax.lra.data.mqar`). An objective's metrics function has the
signature of the classifiers' ``(model, batch, deterministic) -> (loss, sums)``: the loop
adds the sums over batches and divides by ``count``, so ``loss`` and ``accuracy`` are per
predicted token (per scored position for ``token_targets``) here.
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
from spectral_jax.lra.data.task import IGNORE_INDEX

CLASSIFICATION, NEXT_TOKEN, TOKEN_TARGETS = "classification", "next_token", "token_targets"
# The objectives whose model is a causal language model (spectral_jax.nn.CausalLM).
LANGUAGE_MODEL_OBJECTIVES = (NEXT_TOKEN, TOKEN_TARGETS)
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


def token_target_metrics(model: nnx.Module, batch: dict[str, jax.Array],
                         deterministic: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy and accuracy of a causal LM at the positions that carry a target.

    The model reads ``inputs`` and its logits at position t are scored against
    ``targets[:, t]`` wherever that is not ``IGNORE_INDEX`` (-100), weighted by the example's
    ``weight``; every other position adds nothing to the loss, ``correct`` or ``count``.

    Args:
        model: ``(batch, length) -> (batch, length, vocab)`` logits (``CausalLM``).
        batch: ``inputs`` int ``(B, L)``, ``targets`` int ``(B, L)``, ``mask`` bool ``(B, L)``,
          ``weight`` ``(B,)``; packed rows also ``segment_ids`` and ``positions``, passed to
          the model.
        deterministic: no dropout.

    Returns:
        ``(mean loss in nats per target, sums)``; float32 sums ``loss_sum``, ``correct``
        (argmax hits at target positions), ``count`` (target positions) and ``tokens`` (the
        tokens read).

    Example:
        >>> import jax.numpy as jnp
        >>> class Echo:  # predicts the token it reads
        ...     def __call__(self, x, deterministic):
        ...         return jnp.eye(8)[x] * 10.0
        >>> batch = {"inputs": jnp.array([[1, 5, 2, 3]]), "mask": jnp.ones((1, 4), bool),
        ...          "targets": jnp.array([[-100, 5, 7, -100]]), "weight": jnp.ones(1)}
        >>> loss, sums = token_target_metrics(Echo(), batch, True)
        >>> float(sums["count"]), float(sums["correct"])
        (2.0, 1.0)
    """
    packed = {name: batch[name] for name in ("segment_ids", "positions") if name in batch}
    logits = model(batch["inputs"], deterministic=deterministic, **packed).astype(jnp.float32)
    targets = batch["targets"]
    scored = targets != IGNORE_INDEX
    weight = scored.astype(jnp.float32) * batch["weight"][:, None]
    safe = jnp.where(scored, targets, 0)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
    count = weight.sum()
    loss_sum = (losses * weight).sum()
    sums = {
        "loss_sum": loss_sum,
        "correct": ((logits.argmax(-1) == safe) * weight).sum(),
        "count": count,
        "tokens": (batch["mask"] * batch["weight"][:, None]).sum(),
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
    return {NEXT_TOKEN: next_token_metrics, TOKEN_TARGETS: token_target_metrics}.get(objective)
