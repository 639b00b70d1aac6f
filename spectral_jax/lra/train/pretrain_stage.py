"""The self-pretraining stage of a run: build, resume, train, checkpoint, hand over the encoder.

:func:`run_stage` is what :func:`spectral_jax.lra.train.loop.train_and_evaluate` calls before
the fine-tune when ``train.pretrain_steps > 0`` and the fine-tune has no checkpoint yet (the
objective, the model and the losses are in :mod:`spectral_jax.lra.train.pretrain`). It has
the fine-tune's shape: the state is split once, the steps are pure jitted functions of
``(rng_state, state, batch)`` reseeded from ``fold_in(key(seed), step)`` (the masks too), so
a resumed stage repeats the uninterrupted one bit for bit.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from spectral_jax.lra import data
from spectral_jax.lra.train import checkpoint as checkpoint_lib
from spectral_jax.lra.train import distributed
from spectral_jax.lra.train import pretrain as pretrain_lib
from spectral_jax.lra.train import steps as steps_lib
from spectral_jax.lra.train.checkpoint import UNLOGGED_WINDOW, host_window, restore_window
from spectral_jax.lra.train.interrupt import (
    StopSignals,
    TrainingDiverged,
    TrainingInterrupted,
    wait_for_previous_step,
)
from spectral_jax.lra.train.report import MetricWriter


def stage_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` with ``train.steps = train.pretrain_steps``: the stage's schedule length."""
    out = ml_collections.ConfigDict(config.to_dict())
    out.train.steps = int(config.train.pretrain_steps)
    return out


def setup(run: Any) -> tuple[nnx.GraphDef, nnx.State, nnx.State, Any]:
    """The pretraining model and optimizer, replicated on the run's mesh, and their steps.

    Returns:
        ``(graphdef, rng_state, state, (train_step, eval_step))``.
    """
    config = stage_config(run.config)
    model_cfg = run.model_config
    tx = steps_lib.make_optimizer(config)

    def create():
        keys = jax.random.split(jax.random.key(config.seed), 4)
        rngs = nnx.Rngs(params=keys[0], dropout=keys[1], landmarks=keys[2], features=keys[3])
        model = pretrain_lib.PretrainModel(model_cfg, rngs=rngs)
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    graphdef = nnx.graphdef(nnx.eval_shape(create))
    replicated = distributed.replicated(run.mesh)
    rng_state, state = jax.jit(
        lambda: nnx.split(create(), nnx.RngState, ...)[1:], out_shardings=replicated)()
    steps = _make_steps(graphdef, config, model_cfg.vocab_size - 1, replicated,
                        run.batch_sharding)
    return graphdef, rng_state, state, steps


def _make_steps(graphdef: nnx.GraphDef, config: ml_collections.ConfigDict, mask_id: int,
                replicated: Any, batch_sharding: Any) -> tuple[Any, Any]:
    metrics = functools.partial(
        pretrain_lib.stage_metrics, kind=pretrain_lib.objective(config), mask_id=mask_id,
        rate=float(config.train.get("pretrain_mask_rate", 0.5)))
    # Keys of their own (the fine-tune's stream is 1): masks and dropout differ between stages.
    steps = steps_lib.make_steps(
        graphdef, config.seed, replicated, batch_sharding, steps_lib.make_schedule(config),
        config.train.redraw_features_every, metrics, stream=2,
        eval_key=jax.random.fold_in(jax.random.key(config.seed), 3))
    return steps.train, steps.eval


def _evaluate(eval_step, rng_state, state, split, batch_size, sharding, max_batches):
    sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    outputs = []
    for i, batch in enumerate(data.iterate_batches(split, batch_size, shuffle=False)):
        if i == max_batches:
            break
        outputs.append(eval_step(rng_state, state, distributed.global_batch(batch, sharding)))
    for out in jax.device_get(outputs):
        for key in sums:
            sums[key] += float(out[key])
    count = max(sums["count"], 1.0)
    return {"loss": sums["loss_sum"] / count, "accuracy": sums["correct"] / count,
            "count": int(sums["count"])}


def _summary(window: list[dict[str, Any]], seconds: float, step: int,
             batch_size: int) -> dict[str, float]:
    host = jax.device_get(window)
    if not all(bool(m["finite"]) for m in host):
        raise TrainingDiverged(f"pretraining loss is NaN or inf by step {step}; stopped. Lower "
                               "train.optimizer.learning_rate or set train.grad_clip_norm.")
    total = {k: float(sum(m[k] for m in host)) for k in ("loss_sum", "correct", "count",
                                                         "tokens")}
    count = max(total["count"], 1.0)
    return {"loss": total["loss_sum"] / count, "accuracy": total["correct"] / count,
            "grad_norm": float(np.mean([m["grad_norm"] for m in host])),
            "learning_rate": float(host[-1]["learning_rate"]),
            "examples_per_s": len(host) * batch_size / seconds,
            "tokens_per_s": total["tokens"] / seconds}


def run_stage(run: Any, stop: StopSignals) -> nnx.State:
    """Runs (or resumes, or finds finished) the pretraining stage of ``run``.

    Returns:
        The fine-tune's initial state: ``run.setup.state`` with the encoder of the last
        pretraining checkpoint (step ``train.pretrain_steps``).

    Raises:
        TrainingInterrupted: SIGINT or SIGTERM; the step it names is checkpointed.
        TrainingDiverged: the pretraining loss became non-finite.
    """
    config = run.config
    total = int(config.train.pretrain_steps)
    graphdef, rng_state, state, (train_step, eval_step) = setup(run)
    ckpt = checkpoint_lib.Checkpointer(os.path.join(run.workdir, pretrain_lib.CHECKPOINT_DIR),
                                       keep=config.train.keep_checkpoints)
    try:
        start = ckpt.latest_step() or 0
        meta = {"best_val_accuracy": -1.0, "best_step": 0, "wall_time_s": 0.0}
        if start:
            state, meta = ckpt.restore(start, state)
            if run.is_main and start < total:
                print(f"Resuming the pretraining stage from its checkpoint at step {start}.",
                      flush=True)
        if start < total:
            state, meta = _train(run, config, (train_step, eval_step), rng_state, state, meta,
                                 start, ckpt, stop)
        ckpt.wait()
        if run.is_main:
            _write_summary(run.workdir, config, meta)
    finally:
        ckpt.close()
    return transfer(run.setup.state, state)


def _train(run, config, step_fns, rng_state, state, meta, start, ckpt, stop):
    train_step, eval_step = step_fns
    train, total = config.train, int(config.train.pretrain_steps)
    writer = MetricWriter(run.workdir, enabled=run.is_main, resume_step=start or None,
                          tensorboard=False, stage=pretrain_lib.STAGE)
    batches = data.iterate_batches(run.task.splits["train"], train.batch_size, shuffle=True,
                                   seed=config.seed, start_step=start, repeat=True)
    meta = dict(meta)
    window: list[dict[str, Any]] = restore_window(meta.pop(UNLOGGED_WINDOW, None))
    clock = run_start = time.perf_counter()
    base_time = float(meta["wall_time_s"])
    try:
        for step in range(start + 1, total + 1):
            batch = distributed.global_batch(next(batches), run.batch_sharding)
            state, metrics = train_step(rng_state, state, batch)
            window.append(metrics)
            wait_for_previous_step(window)  # a stop signal takes effect within ~2 steps
            is_eval = step % train.eval_every == 0 or step == total
            if step % train.log_every == 0 or is_eval:
                jax.block_until_ready(metrics)
                summary = _summary(window, time.perf_counter() - clock, step, train.batch_size)
                writer.write(step, "train", summary)
                if run.is_main:
                    print(f"pretrain step {step}/{total}: loss {summary['loss']:.4f}, token "
                          f"accuracy {summary['accuracy']:.4f}", flush=True)
                window, clock = [], time.perf_counter()
            if is_eval:
                val = _evaluate(eval_step, rng_state, state, run.task.splits["validation"],
                                run.eval_batch_size, run.batch_sharding, train.eval_steps)
                if val["accuracy"] >= meta["best_val_accuracy"]:
                    meta = {**meta, "best_val_accuracy": val["accuracy"], "best_step": step}
                meta = {**meta, "wall_time_s": base_time + time.perf_counter() - run_start,
                        "val_loss": val["loss"], "val_accuracy": val["accuracy"]}
                writer.write(step, "validation", val)
                if run.is_main:
                    print(f"pretrain step {step}/{total}: validation loss {val['loss']:.4f}, "
                          f"token accuracy {val['accuracy']:.4f} (best "
                          f"{meta['best_val_accuracy']:.4f})", flush=True)
                ckpt.save(step, state, meta, val["accuracy"])
                clock = time.perf_counter()
            if stop.signum is not None:
                if not is_eval:  # the unlogged steps' metrics go with it, as in the fine-tune
                    meta = {**meta, "wall_time_s": base_time + time.perf_counter() - run_start}
                    ckpt.save(step, state, {**meta, UNLOGGED_WINDOW: host_window(window)} if window
                              else meta, None)
                raise TrainingInterrupted(step, stop.signum, stage="pretraining")
    finally:
        writer.close()
    return state, meta


def transfer(classifier_state: nnx.State, pretrain_state: nnx.State) -> nnx.State:
    """``classifier_state`` with the encoder (every variable under it) of ``pretrain_state``.

    Both are ``(model, optimizer)`` states without RNG streams; the classifier's head and its
    optimizer state are kept as initialised.
    """
    pure = nnx.to_pure_dict(classifier_state)
    pure[0]["encoder"] = nnx.to_pure_dict(pretrain_state)[0]["encoder"]
    state = jax.tree.map(lambda x: x, classifier_state)  # a copy: replace_by_pure_dict mutates
    nnx.replace_by_pure_dict(state, pure)
    return state


def _write_summary(workdir: str, config: ml_collections.ConfigDict, meta: dict) -> None:
    objective = pretrain_lib.objective(config)
    summary = {"steps": int(config.train.pretrain_steps),
               "objective": objective,
               # Next-token prediction masks nothing: no rate to record.
               "mask_rate": (float(config.train.get("pretrain_mask_rate", 0.5))
                             if objective == "denoise" else None),
               "val_loss": meta.get("val_loss"), "val_accuracy": meta.get("val_accuracy"),
               "best_val_accuracy": meta.get("best_val_accuracy"),
               "wall_time_s": meta.get("wall_time_s")}
    with open(os.path.join(workdir, pretrain_lib.SUMMARY_FILE), "w") as f:
        json.dump(summary, f, indent=2)


def read_summary(workdir: str) -> dict[str, Any] | None:
    """The stage's ``pretrain.json`` (None when the run has no pretraining stage)."""
    path = os.path.join(workdir, pretrain_lib.SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
