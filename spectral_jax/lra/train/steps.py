"""The model built from a config, and the jitted train and eval steps.

The steps are pure functions of ``(rng_state, state, batch)`` in the style of the Flax gemma
example's ``jax_train_step``: the module graph is split once, ``nnx.merge`` runs only while
tracing, and ``jax.jit`` sees plain pytrees, so each step compiles exactly once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from spectral_jax import UsageError
from spectral_jax.nn import TransformerConfig

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


def build_model(cfg: TransformerConfig, dual: bool, seed: int) -> nnx.Module:
    """The classifier for ``cfg``; parameters and random features seeded from ``seed``.

    Example:
        >>> from spectral_jax.nn import TransformerConfig
        >>> m = build_model(TransformerConfig(vocab_size=5, num_classes=2, max_length=8), False, 0)
    """
    from spectral_jax.nn import DualEncoderClassifier, SequenceClassifier

    keys = jax.random.split(jax.random.key(seed), 4)
    rngs = nnx.Rngs(params=keys[0], dropout=keys[1], landmarks=keys[2], features=keys[3])
    cls = DualEncoderClassifier if dual else SequenceClassifier
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

    Returns:
        :class:`Steps`.

    Example:
        :func:`spectral_jax.lra.train.run.setup_run` builds a run's steps with it; the loop then
        calls ``state, metrics = steps.train(rng_state, state, batch)``.
    """
    base_key = jax.random.fold_in(jax.random.key(seed), 1)

    def train_step(rng_state, state, batch_):
        model, optimizer = nnx.merge(graphdef, rng_state, state)
        step = optimizer.step[...]
        key = jax.random.fold_in(base_key, step)
        nnx.reseed(model, dropout=jax.random.fold_in(key, 0), landmarks=jax.random.fold_in(key, 1))
        if redraw_features_every:
            _redraw_at(model, step, redraw_features_every, jax.random.fold_in(key, 2))

        def loss_fn(model_):
            return _metrics(model_, batch_, deterministic=False)

        (loss, sums), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        sums["learning_rate"] = schedule(step)
        sums["grad_norm"] = optax.tree.norm(grads)
        sums["finite"] = jnp.isfinite(loss)
        return nnx.split((model, optimizer), nnx.RngState, ...)[2], sums

    def eval_step(rng_state, state, batch_):
        model, _ = nnx.merge(graphdef, rng_state, state)
        return _metrics(model, batch_, deterministic=True)[1]

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
