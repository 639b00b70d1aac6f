"""Learning-rate schedules and the optimizer of both LRA protocols, built from optax parts."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_collections
import optax

from spectral_jax import _checks

# The learning-rate schedules make_schedule implements (config: train.schedule.name).
SCHEDULES = ("rsqrt", "cosine", "linear", "constant")


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """The learning-rate schedule of ``config.train``.

    * ``rsqrt`` (LRA ListOps/Text/Retrieval): ``lr * min(1, s/w) / sqrt(max(s, w))``; the
      learning rate is LRA's *base constant*, the peak is ``lr / sqrt(w)``.
    * ``cosine`` (LRA image tasks): ``lr * min(1, s/w) * 0.5 (1 + cos(pi * frac))`` with
      ``frac = ((s - w) / steps_per_cycle) mod 1``
      (LRA ``train_utils.create_learning_rate_scheduler``).
    * ``linear`` (Nystromformer/Skyformer one-cycle): linear warmup to ``lr``, linear decay to 0.
    * ``constant``: linear warmup, then ``lr``.

    Args:
        config: a training config (``train.optimizer.learning_rate``, ``train.schedule.*``,
          ``train.steps``).

    Returns:
        ``step (int32 scalar) -> learning rate (float32 scalar)``.

    Raises:
        spectral_jax.UsageError: for an unknown schedule name or a negative warmup.

    Example:
        >>> import ml_collections
        >>> cfg = ml_collections.ConfigDict({"train": {"steps": 10, "optimizer": {
        ...     "learning_rate": 1.0}, "schedule": {"name": "linear", "warmup_steps": 5,
        ...     "steps_per_cycle": None}}})
        >>> float(make_schedule(cfg)(5))
        1.0
    """
    lr = config.train.optimizer.learning_rate
    steps = config.train.steps
    sched = config.train.schedule
    warmup = sched.warmup_steps
    _checks.choice("config", "train.schedule.name", sched.name, SCHEDULES)
    _checks.nonnegative_int("config", "train.schedule.warmup_steps", warmup)

    def ramp(step):
        return jnp.minimum(1.0, step / max(warmup, 1)) if warmup else 1.0

    if sched.name == "rsqrt":
        return lambda step: lr * ramp(step) / jnp.sqrt(jnp.maximum(step, max(warmup, 1)))
    if sched.name == "cosine":
        cycle = sched.steps_per_cycle or steps

        def cosine(step):
            frac = jnp.mod(jnp.maximum(0.0, (step - warmup) / cycle), 1.0)
            return lr * ramp(step) * jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(math.pi * frac)))

        return cosine
    if sched.name == "linear":
        decay = optax.linear_schedule(lr, 0.0, max(steps - warmup, 1))
        if not warmup:
            return decay
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])
    return lambda step: lr * ramp(step)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW with the config's schedule, after optional global-norm gradient clipping.

    LRA's flax ``Adam(weight_decay=wd)`` decays by ``lr * wd * p`` on all parameters, which is
    ``optax.adamw`` without a mask (reference lra.md section 1.2).

    Args:
        config: a training config (``train.optimizer``, ``train.grad_clip_norm``).

    Returns:
        An optax transformation.

    Raises:
        spectral_jax.UsageError: for a non-positive learning rate or clip norm.

    Example:
        >>> import ml_collections
        >>> cfg = ml_collections.ConfigDict({"train": {"steps": 10, "grad_clip_norm": 1.0,
        ...     "optimizer": {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.98, "eps": 1e-9,
        ...     "weight_decay": 0.1}, "schedule": {"name": "constant", "warmup_steps": 0,
        ...     "steps_per_cycle": None}}})
        >>> tx = make_optimizer(cfg)
    """
    opt = config.train.optimizer
    _checks.number("config", "train.optimizer.learning_rate", opt.learning_rate, low=0.0,
                   low_open=True)
    clip = _checks.number("config", "train.grad_clip_norm", config.train.grad_clip_norm,
                          low=0.0, low_open=True, allow_none=True)
    adamw = optax.adamw(
        make_schedule(config), b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay
    )
    return adamw if clip is None else optax.chain(optax.clip_by_global_norm(clip), adamw)
