"""Self-pretraining (SPT): a denoising stage on the training split's own inputs, then fine-tuning.

Amos, Berant & Gupta 2024, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors" (ICLR 2024, arXiv 2310.02980), §2-3: before the classifier is
trained, the same encoder is trained to reconstruct its training inputs (labels unused), and
the classifier fine-tunes from those weights. Their code (``IdoAmos/not-from-scratch``)
masks 50% of the tokens for bidirectional models and uses next-token prediction (causal
masking) for causal ones; so does this module:

- ``"denoise"`` (bidirectional methods): each valid token is replaced by a mask id with
  probability ``train.pretrain_mask_rate``; the loss is the cross-entropy of the original
  token at the replaced positions only (padding and kept tokens give no loss). The mask id is
  one more row of the token embedding (``vocab_size`` grows by one for the whole run, the
  classifier's too), so no real token, not even id 0 of the image tasks, is overloaded.
- ``"next_token"`` (causal-only methods, ``model.is_causal``): position t predicts token
  t + 1, over pairs of valid positions.

The pretraining model is the classifier's :class:`~spectral_jax.nn.TransformerEncoder` and a
small separate head, one Dense to the vocabulary (:class:`PretrainModel`). Its run lives in
the same workdir: checkpoints under ``pretrain_checkpoints/``, records in ``metrics.jsonl``
with ``"stage": "pretrain"`` (the fine-tune's carry ``"stage": "finetune"``), and its summary
in ``pretrain.json`` and ``results.json["pretrain"]``. A run killed during either stage and
started again resumes inside that stage, bit-exact: the fine-tune starts when its own
checkpoint directory is empty, from the encoder of the last pretraining checkpoint (saved at
``train.pretrain_steps``) and a fresh classifier head and optimizer.

Config (``train`` section): ``pretrain_steps`` (0: no pretraining; ``FILE:ARG,spt`` sets it
to the preset's ``train.steps``), ``pretrain_objective`` (``"auto"``: next-token when the
model is causal, else denoising) and ``pretrain_mask_rate`` (default 0.5). The optimizer and
schedule are the fine-tune's, over ``pretrain_steps`` steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from spectral_jax import UsageError, _checks
from spectral_jax.nn import TransformerConfig, TransformerEncoder

OBJECTIVES = ("auto", "denoise", "next_token")
CHECKPOINT_DIR = "pretrain_checkpoints"
SUMMARY_FILE = "pretrain.json"
STAGE, FINETUNE = "pretrain", "finetune"


def enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether ``config`` has a pretraining stage (``train.pretrain_steps > 0``)."""
    return int(config.train.get("pretrain_steps", 0) or 0) > 0


def objective(config: ml_collections.ConfigDict) -> str:
    """``"denoise"`` or ``"next_token"``: the configured one, or for ``"auto"`` the model's."""
    name = config.train.get("pretrain_objective", "auto")
    if name == "auto":
        return "next_token" if config.model.get("is_causal", False) else "denoise"
    return name


def check_config(config: ml_collections.ConfigDict) -> None:
    """Checks the pretraining fields against the method and the task, before anything runs.

    Raises:
        spectral_jax.UsageError: a bad value; ``"next_token"`` for a model that is not causal
          or a method with no causal form; ``"denoise"`` for a causal-only method (each names
          the objective and the method); pretraining a task whose objective is already
          next-token prediction.
    """
    from spectral_jax.attention import get_attention_spec
    from spectral_jax.lra.data.registry import get_task_spec

    train, owner = config.train, "config"
    steps = _checks.nonnegative_int(owner, "train.pretrain_steps",
                                    train.get("pretrain_steps", 0))
    _checks.choice(owner, "train.pretrain_objective", train.get("pretrain_objective", "auto"),
                   OBJECTIVES)
    _checks.number(owner, "train.pretrain_mask_rate", train.get("pretrain_mask_rate", 0.5),
                   low=0.0, high=1.0, low_open=True)
    if not steps:
        return
    spec = get_attention_spec(config.model.attention)
    chosen = objective(config)
    if chosen == "next_token" and not spec.supports_causal:
        raise UsageError(
            f"train.pretrain_objective='next_token' needs a causal model, but attention="
            f"{spec.name!r} has no causal form; use pretrain_objective='denoise' (or 'auto')")
    if chosen == "next_token" and not config.model.get("is_causal", False):
        raise UsageError(
            f"train.pretrain_objective='next_token' with attention={spec.name!r} needs "
            "model.is_causal=True (a bidirectional model would see the token it predicts)")
    if chosen == "denoise" and spec.causal_only:
        raise UsageError(
            f"train.pretrain_objective='denoise' needs a bidirectional model, but attention="
            f"{spec.name!r} is causal only; use pretrain_objective='next_token' (or 'auto')")
    task_objective = getattr(get_task_spec(config.task), "objective", "classification")
    if task_objective != "classification":
        raise UsageError(
            f"train.pretrain_steps={steps} with task={config.task!r}: self-pretraining "
            f"prepares a classifier, and this task's objective is {task_objective!r}")


def added_token_ids(config: ml_collections.ConfigDict) -> int:
    """How many token ids pretraining adds to the task's: 1 (the mask id) when denoising."""
    return int(enabled(config) and objective(config) == "denoise")


def model_config(config: ml_collections.ConfigDict, cfg: TransformerConfig) -> TransformerConfig:
    """``cfg`` with the ids pretraining adds (:func:`added_token_ids`) in its vocabulary."""
    return dataclasses.replace(cfg, vocab_size=cfg.vocab_size + added_token_ids(config))


def writer_stage(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The fine-tune's :class:`MetricWriter` keywords: tagged, keeping the pretraining's records."""
    return {"stage": FINETUNE, "keep_stages": (STAGE,)} if enabled(config) else {}


class PretrainModel(nnx.Module):
    """The classifier's encoder and a separate token head: logits for every position.

    Args:
        config: the run's model configuration (``vocab_size`` includes the mask id).
        rngs: as for :class:`spectral_jax.nn.SequenceClassifier`.

    Example:
        >>> import jax.numpy as jnp
        >>> cfg = TransformerConfig(vocab_size=6, num_classes=2, max_length=4, num_layers=1)
        >>> model = PretrainModel(cfg, rngs=nnx.Rngs(0))
        >>> model(jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4), bool), deterministic=True).shape
        (2, 4, 6)
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        self.cls_token = config.pooling == "cls"
        self.encoder = TransformerEncoder(config, cls_token=self.cls_token, rngs=rngs)
        self.head = nnx.Linear(config.embed_dim, config.vocab_size, dtype=jnp.float32,
                               param_dtype=config.param_dtype, rngs=rngs)

    def __call__(self, inputs: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
        """float32 logits ``(batch, length, vocab_size)`` for int ``(batch, length)`` inputs."""
        x = self.encoder(inputs, mask, deterministic=deterministic)
        if self.cls_token:
            x = x[:, 1:]
        return self.head(x.astype(jnp.float32))


def corrupt(inputs: jax.Array, valid: jax.Array, key: jax.Array, rate: float,
            mask_id: int) -> tuple[jax.Array, jax.Array]:
    """Replaces each valid token by ``mask_id`` with probability ``rate``.

    Returns:
        ``(corrupted inputs, selected)``: selected is bool, True where a token was replaced.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> x = jnp.array([[3, 4, 5, 0]])
        >>> c, sel = corrupt(x, x > 0, jax.random.key(0), 1.0, 9)
        >>> c.tolist(), sel.tolist()
        ([[9, 9, 9, 0]], [[True, True, True, False]])
    """
    selected = valid & (jax.random.uniform(key, inputs.shape) < rate)
    return jnp.where(selected, mask_id, inputs), selected


def token_loss(logits: jax.Array, targets: jax.Array,
               selected: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean cross-entropy of ``targets`` over the ``selected`` positions only.

    Args:
        logits: float ``(batch, length, vocab)``.
        targets: int ``(batch, length)``.
        selected: bool ``(batch, length)``: the positions that count (masked tokens, or pairs
          of valid positions for next-token prediction); the others give nothing.

    Returns:
        ``(loss, sums)`` with float32 sums ``loss_sum``, ``correct`` and ``count``
        (selected positions); the loss is 0 when none is selected.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.log(jnp.array([[[0.5, 0.5], [0.9, 0.1]]]))
        >>> loss, sums = token_loss(logits, jnp.array([[0, 0]]), jnp.array([[False, True]]))
        >>> round(float(loss), 4), float(sums["count"])
        (0.1054, 1.0)
    """
    logits = logits.astype(jnp.float32)
    weight = selected.astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    count = weight.sum()
    sums = {"loss_sum": (losses * weight).sum(),
            "correct": ((logits.argmax(-1) == targets) * weight).sum(), "count": count}
    return sums["loss_sum"] / jnp.maximum(count, 1.0), sums


def stage_metrics(model: PretrainModel, batch: dict[str, jax.Array], key: jax.Array, *,
                  deterministic: bool, kind: str, rate: float,
                  mask_id: int) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The pretraining loss of ``model`` on a classification batch (labels unused).

    A dual-encoder batch ``(batch, 2, length)`` gives its documents as separate rows; rows
    of weight 0 (evaluation padding) count nowhere.
    """
    inputs, valid = batch["inputs"], batch["mask"]
    weight = batch["weight"] > 0
    if inputs.ndim == 3:  # retrieval: each document is a sequence of its own
        weight = jnp.repeat(weight, inputs.shape[1])
        inputs, valid = inputs.reshape(-1, inputs.shape[-1]), valid.reshape(-1, valid.shape[-1])
    valid = valid & weight[:, None]
    if kind == "denoise":
        corrupted, selected = corrupt(inputs, valid, key, rate, mask_id)
        logits = model(corrupted, valid, deterministic=deterministic)
        loss, sums = token_loss(logits, inputs, selected)
    else:
        logits = model(inputs, valid, deterministic=deterministic)
        loss, sums = token_loss(logits[:, :-1], inputs[:, 1:], valid[:, :-1] & valid[:, 1:])
    sums["tokens"] = valid.sum().astype(jnp.float32)
    return loss, sums
