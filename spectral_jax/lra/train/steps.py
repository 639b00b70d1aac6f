"""The model, the optimizer and its learning-rate schedule built from a config, and the jitted
train and eval steps.

The steps are pure functions of ``(rng_state, state, batch)`` in the style of the Flax gemma
example's ``jax_train_step``: the module graph is split once, ``nnx.merge`` runs only while
tracing, and ``jax.jit`` sees plain pytrees, so each step compiles exactly once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from spectral_jax import UsageError, _checks
from spectral_jax.lra.train import distributed
from spectral_jax.nn import TransformerConfig
from spectral_jax.parallel import split_sequence

# Model fields that model_config resolves itself (from the data, or converted); every other
# TransformerConfig field comes from the config file as-is.
_RESOLVED_FIELDS = ("vocab_size", "num_classes", "max_length", "dtype", "attention_kwargs",
                    "param_dtype")
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(TransformerConfig)
                      if f.name not in _RESOLVED_FIELDS)


def model_config(config: ml_collections.ConfigDict, task: Any) -> TransformerConfig:
    """Converts ``config.model`` into the frozen :class:`TransformerConfig` for ``task``.

    ``vocab_size``, ``num_classes`` and ``max_length`` left as None take the task's values; set
    values must cover the task (a larger vocabulary or length is allowed, fewer classes are not).

    Args:
        config: a training config.
        task: a loaded ``spectral_jax.lra.data.Task``.

    Returns:
        The model configuration.

    Raises:
        spectral_jax.UsageError: when a set value does not fit the data, or for an unknown dtype.

    Example:
        >>> import types, ml_collections
        >>> from spectral_jax.lra.train import config_lib
        >>> cfg = config_lib.build_config(task="listops", protocol="quick", attention="softmax",
        ...     seed=0, data={"dir": "d"}, model={}, train={})
        >>> task = types.SimpleNamespace(vocab_size=20, num_classes=10, max_length=32)
        >>> model_config(cfg, task).max_length
        32
    """
    m = config.model
    resolved = {}
    for name, have in (("vocab_size", task.vocab_size), ("max_length", task.max_length)):
        want = m[name]
        if want is not None and want < have:
            raise UsageError(
                f"model.{name}={want} is smaller than the data's {name}={have} "
                f"(data.dir={config.data.dir!r}); set it to >= {have} or None"
            )
        resolved[name] = have if want is None else want
    if m.num_classes is not None and m.num_classes != task.num_classes:
        raise UsageError(
            f"model.num_classes={m.num_classes} differs from the data's num_classes="
            f"{task.num_classes}; set it to {task.num_classes} or None"
        )
    try:
        dtype = jnp.dtype(m.dtype)
    except TypeError:
        raise UsageError(f"model.dtype={m.dtype!r} is not a dtype name (e.g. 'float32')") from None
    return TransformerConfig(
        num_classes=task.num_classes,
        dtype=dtype,
        attention_kwargs=m.attention_kwargs.to_dict(),
        **resolved,
        **{name: m[name] for name in _MODEL_FIELDS},
    )


def build_model(cfg: TransformerConfig, dual: bool, seed: int, *,
                lm: bool = False) -> nnx.Module:
    """The classifier for ``cfg`` (``lm``: the causal LM); parameters and features from ``seed``.

    Example:
        >>> from spectral_jax.nn import TransformerConfig
        >>> m = build_model(TransformerConfig(vocab_size=5, num_classes=2, max_length=8), False, 0)
    """
    from spectral_jax.nn import DualEncoderClassifier, SequenceClassifier

    keys = jax.random.split(jax.random.key(seed), 4)
    rngs = nnx.Rngs(params=keys[0], dropout=keys[1], landmarks=keys[2], features=keys[3])
    cls = DualEncoderClassifier if dual else SequenceClassifier
    if lm:
        from spectral_jax.nn import CausalLM

        cls = CausalLM
    return cls(cfg, rngs=rngs)


def _metrics(model: nnx.Module, batch: dict[str, jax.Array], deterministic: bool):
    logits = model(batch["inputs"], batch["mask"], deterministic=deterministic)
    logits = logits.astype(jnp.float32)
    weight = batch["weight"]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    count = weight.sum()
    sums = {
        "loss_sum": (losses * weight).sum(),
        "correct": ((logits.argmax(-1) == batch["label"]) * weight).sum(),
        "count": count,
        "tokens": (batch["mask"].sum(axis=tuple(range(1, batch["mask"].ndim))) * weight).sum(),
    }
    return sums["loss_sum"] / jnp.maximum(count, 1.0), sums


@dataclasses.dataclass(frozen=True)
class Steps:
    """The jitted step functions of one run (one compile each).

    Attributes:
        train: ``(rng_state, state, batch) -> (state, metrics)``; ``state`` is donated.
          ``metrics`` holds float32 scalars ``loss_sum, correct, count, tokens, grad_norm`` and
          ``finite`` (bool: the loss was finite).
        eval: ``(rng_state, state, batch) -> metrics`` (no dropout, fixed landmarks).
    """

    train: Callable[..., Any]
    eval: Callable[..., Any]


def _redraw_at(model: nnx.Module, step: jax.Array, every: int, key: jax.Array) -> None:
    """Redraws the Performer projections when ``step`` is a positive multiple of ``every``."""
    from spectral_jax.nn import RandomFeatures, redraw_features

    # A snapshot of the arrays: the State itself would follow the in-place redraw.
    old = nnx.to_pure_dict(nnx.state(model, RandomFeatures))
    # Drawn every step (a few d x d QRs per layer) and kept only when due: one straight-line
    # step program, with no branch for XLA to carry.
    redraw_features(model, key)
    state = nnx.state(model, RandomFeatures)
    due = (step > 0) & (step % every == 0)
    nnx.replace_by_pure_dict(state, jax.tree.map(
        lambda a, b: jnp.where(due, b, a), old, nnx.to_pure_dict(state)))
    nnx.update(model, state)


def make_steps(
    graphdef: nnx.GraphDef, seed: int, replicated: jax.sharding.Sharding,
    batch: jax.sharding.Sharding, schedule: optax.Schedule, redraw_features_every: int = 0,
    metrics: Callable[..., Any] | None = None, *, stream: int = 1,
    eval_key: jax.Array | None = None,
) -> Steps:
    """Builds the train and eval steps of a split ``(model, optimizer)`` graph.

    Dropout and Skyformer landmarks are reseeded every step from ``fold_in(key(seed), step)``,
    so the randomness of step ``s`` does not depend on how the run got there (resume-exact).
    With ``redraw_features_every = N > 0``, Performer projections are redrawn before steps
    N, 2N, ... (Choromanski et al. 2021, §3), keyed the same way.

    Args:
        graphdef: from ``nnx.split((model, optimizer), nnx.RngState, ...)``.
        seed: the run's seed.
        replicated: sharding of the state (and of metrics).
        batch: sharding of batch arrays (split over the data axis).
        schedule: the learning-rate schedule (reported as ``learning_rate``; the rate
          applied at that step).
        redraw_features_every: redraw Performer features every this many steps; 0: never.
        metrics: ``(model, batch, deterministic) -> (loss, sums)``; None: the classifiers'
          (:mod:`spectral_jax.lra.train.objectives` has the others). With ``eval_key`` set,
          it is also called with ``key=``: ``fold_in(step key, 3)`` in a train step and
          ``eval_key`` in evaluation (the pretraining stage draws its token masks from it).
        stream: the steps' randomness comes from ``fold_in(key(seed), stream)``: 1 for the
          classifier, another number for a stage that must not share its dropout and masks.
        eval_key: see ``metrics``; None: the metrics take no key.

    Returns:
        :class:`Steps`.

    Example:
        :func:`spectral_jax.lra.train.run.setup_run` builds a run's steps with it; the loop then
        calls ``state, metrics = steps.train(rng_state, state, batch)``.
    """
    base_key = jax.random.fold_in(jax.random.key(seed), stream)
    _metrics_fn = metrics or _metrics
    keyed = eval_key is not None
    mesh = getattr(batch, "mesh", None)
    seq = distributed.SEQ_AXIS
    # A (data, seq) mesh: every attention layer splits each sequence over the seq axis.
    split = (functools.partial(split_sequence, mesh, axis_name=seq,
                               batch_axis=distributed.DATA_AXIS)
             if mesh is not None and mesh.shape.get(seq, 1) > 1 else contextlib.nullcontext)

    def train_step(rng_state, state, batch_):
        model, optimizer = nnx.merge(graphdef, rng_state, state)
        step = optimizer.step[...]
        key = jax.random.fold_in(base_key, step)
        nnx.reseed(model, dropout=jax.random.fold_in(key, 0), landmarks=jax.random.fold_in(key, 1))
        if redraw_features_every:
            _redraw_at(model, step, redraw_features_every, jax.random.fold_in(key, 2))

        def loss_fn(model_):
            extra = {"key": jax.random.fold_in(key, 3)} if keyed else {}
            return _metrics_fn(model_, batch_, deterministic=False, **extra)

        with split():
            (loss, sums), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        sums["learning_rate"] = schedule(step)
        sums["grad_norm"] = optax.tree.norm(grads)
        sums["finite"] = jnp.isfinite(loss)
        return nnx.split((model, optimizer), nnx.RngState, ...)[2], sums

    def eval_step(rng_state, state, batch_):
        model, _ = nnx.merge(graphdef, rng_state, state)
        extra = {"key": eval_key} if keyed else {}
        with split():
            return _metrics_fn(model, batch_, deterministic=True, **extra)[1]

    return Steps(
        train=jax.jit(
            train_step,
            in_shardings=(replicated, replicated, batch),
            out_shardings=(replicated, replicated),
            donate_argnums=1,
        ),
        eval=jax.jit(
            eval_step, in_shardings=(replicated, replicated, batch), out_shardings=replicated
        ),
    )

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
