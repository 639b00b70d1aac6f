"""``train_and_evaluate(config, workdir)``: the LRA training loop, in the Flax examples' style.

Read top to bottom: open the run (:mod:`spectral_jax.lra.train.run`), resume from its last
checkpoint, train with periodic validation and checkpoints, evaluate the final and best
checkpoints on the test split, write ``results.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from spectral_jax import _checks
from spectral_jax.lra import data
from spectral_jax.lra.train import distributed, pretrain_stage, report, warm_start
from spectral_jax.lra.train import pretrain as pretrain_lib
from spectral_jax.lra.train import run as run_lib
from spectral_jax.lra.train import workdir as workdir_lib
from spectral_jax.lra.train.checkpoint import UNLOGGED_WINDOW, host_window, restore_window
from spectral_jax.lra.train.interrupt import (
    StopSignals,
    TrainingDiverged,
    TrainingInterrupted,
    wait_for_previous_step,
)
from spectral_jax.lra.train.objectives import bits_per_byte
from spectral_jax.lra.train.report import MetricWriter, Reporter

Meta = dict[str, Any]  # what a checkpoint stores besides the state: best_* and wall_time_s


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *, overwrite: bool = False,
    extend: bool = False,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its last checkpoint, and evaluates on test.

    Evaluates on the validation split every ``train.eval_every`` steps and checkpoints there
    (orbax, the last ``train.keep_checkpoints`` plus the best). At the end both the final and the
    best-validation parameters are evaluated on the test split, next to the test split's
    majority-class baseline, and everything lands in ``workdir/results.json``. A run killed at
    any point and started again with the same config continues from its last checkpoint with the
    same data order and randomness, and ``metrics.jsonl`` reads as if it had never stopped.
    SIGINT (Ctrl-C) or SIGTERM (preemption) in a single-process run finishes the current
    step, checkpoints it and raises :class:`~spectral_jax.lra.train.interrupt.TrainingInterrupted`
    (see :mod:`spectral_jax.lra.train.interrupt`); resuming continues bit-exact.

    Args:
        config: a config such as ``lra/listops`` (see :mod:`spectral_jax.lra.train.config_lib`).
        workdir: run directory (created). Holding a different config, it is refused.
        overwrite: delete a previous run's files in ``workdir`` first.
        extend: continue the run in ``workdir`` to ``config.train.steps``, more steps than it
          was started with (its config must differ in ``train.steps`` alone). The schedule is
          re-evaluated for the new total from the next step on (see
          :mod:`spectral_jax.lra.train.workdir`); ``results.json`` lists the extensions.

    Returns:
        The contents of ``results.json``: ``test_accuracy`` (best-validation checkpoint),
        ``final_test_accuracy``, ``majority_baseline``, ``best_step``, ``steps``,
        ``wall_time_s``, ``num_params``, the training rate (``examples_per_s``,
        ``tokens_per_s``, ``steps_per_s``: median over the logged windows after the first),
        ``train_step_peak_bytes`` (the compiled train step's peak memory per device), ``compiles``
        (XLA compilations of each step in this run's training and final evaluation),
        ``extensions`` (``[]`` unless extended), ``pretrain`` (with ``train.pretrain_steps``:
        the self-pretraining stage's summary, :mod:`spectral_jax.lra.train.pretrain`),
        ``init_from_step`` (with ``train.init_from``: the source run's checkpoint the model
        started from) and the resolved ``config``.

    Raises:
        spectral_jax.UsageError: invalid config (unknown task, method or protocol; batch size
          not divisible by the device count; ...), or ``workdir`` holding a different config.
          Raised before anything is compiled.
        spectral_jax.UsageTypeError: a config value of the wrong kind.
        FileNotFoundError: the task's data directory is missing (the message says how to get it).
        TrainingDiverged: the loss became non-finite (the message names the step).
        TrainingInterrupted: SIGINT or SIGTERM; the step it names is checkpointed.

    Example:
        ``spectral-jax train --config lra/listops:quick --workdir runs/x`` calls
        ``train_and_evaluate(load_config("lra/listops:quick"), "runs/x")``;
        tests/test_train_loop.py runs it on tiny data.
    """
    run = run_lib.open_for_training(config, workdir, overwrite=overwrite, extend=extend)
    config = run.config
    # One process alone may not stop: the others would wait for it in the next step.
    with run, StopSignals(enabled=jax.process_count() == 1) as stop:
        state = run.setup.state
        meta: Meta = {"best_val_accuracy": -1.0, "best_step": 0, "wall_time_s": 0.0}
        start_step = run.checkpoints.latest_step()
        if start_step is not None:
            state, meta = run.checkpoints.restore(start_step, state)
        elif pretrain_lib.enabled(config):  # the fine-tune starts from the pretrained encoder
            state = pretrain_stage.run_stage(run, stop)
        elif warm_start.enabled(config):  # a curriculum's next stage
            source = config.train.init_from
            _, source_state, source_step = run_lib.restore_for_evaluation(source, "best")
            state = warm_start.warm_start(run, source, source_state, source_step)
            meta["init_from_step"] = source_step  # recorded with every checkpoint
        writer = MetricWriter(workdir, enabled=run.is_main, resume_step=start_step,
                              **pretrain_lib.writer_stage(config))
        reporter = Reporter(config.train.steps, start=start_step or 0, enabled=run.is_main)
        if run.extension is not None:
            _log_extension(run.extension, writer, reporter)
        try:
            with report.CompileCounter() as compiles:
                state, meta = _train(run, state, meta, start_step or 0, writer, reporter, stop)
                results = _final_evaluation(run, state, meta)
            if stop.signum is not None:  # during the final evaluation: the last step is saved
                raise TrainingInterrupted(config.train.steps, stop.signum)
            # The cost side of the result (what a sweep's table compares methods on).
            probe = distributed.global_batch(
                next(data.iterate_batches(run.task.splits["train"], config.train.batch_size,
                                          shuffle=False)), run.batch_sharding)
            results.update(
                **report.training_throughput(workdir, config.train.batch_size),
                train_step_peak_bytes=report.step_peak_bytes(
                    run.setup.steps.train, run.setup.rng_state, state, probe),
            )
        finally:
            reporter.close()
            writer.close()

    step_fns = run.setup.steps
    results.update(
        num_params=run.setup.num_params,
        num_devices=run.mesh.devices.size,
        num_processes=jax.process_count(),
        compiles={name: compiles.count(fn) for name, fn in
                  (("train", step_fns.train), ("eval", step_fns.eval))},
        data_source=run.task.source,
        extensions=workdir_lib.read_extensions(workdir),
        **({"pretrain": pretrain_stage.read_summary(workdir)} if pretrain_lib.enabled(config)
           else {}),
        config=_resolved(config, run.model_config),
    )
    if run.is_main:
        with open(os.path.join(workdir, workdir_lib.RESULTS_FILE), "w") as f:
            json.dump(results, f, indent=2)
    reporter.summary(results)
    return results


def _train(run: run_lib.Run, state: nnx.State, meta: Meta, start_step: int,
           writer: MetricWriter, reporter: Reporter,
           stop: StopSignals) -> tuple[nnx.State, Meta]:
    """Steps ``start_step + 1 .. train.steps``: log, validate, checkpoint; stop on a signal."""
    config, step_fns = run.config, run.setup.steps
    train_cfg = config.train
    split = run.task.splits["train"]
    batches = data.iterate_batches(
        split, train_cfg.batch_size, shuffle=True, seed=config.seed, start_step=start_step,
        repeat=True,
    ) if not train_cfg.bucket_multiple else data.iterate_length_buckets(
        split, train_cfg.batch_size, multiple=train_cfg.bucket_multiple,
        window=train_cfg.bucket_window, seed=config.seed, start_step=start_step)
    meta = dict(meta)
    window: list[dict[str, Any]] = restore_window(meta.pop(UNLOGGED_WINDOW, None))
    window_start = time.perf_counter()
    run_start = time.perf_counter()
    base_time = float(meta["wall_time_s"])
    for step in range(start_step + 1, train_cfg.steps + 1):
        batch = distributed.global_batch(next(batches), run.batch_sharding)
        state, metrics = step_fns.train(run.setup.rng_state, state, batch)
        window.append(metrics)
        wait_for_previous_step(window)  # a stop signal takes effect within ~2 steps
        reporter.advance()
        is_eval = step % train_cfg.eval_every == 0 or step == train_cfg.steps
        if step % train_cfg.log_every == 0 or is_eval:
            # Steps are dispatched asynchronously: wait for them, or the clock counts only
            # their dispatch.
            jax.block_until_ready(metrics)
            summary = _summarize(window, time.perf_counter() - window_start, step)
            writer.write(step, "train", summary)
            reporter.train(step, summary)
            window, window_start = [], time.perf_counter()
        if is_eval:
            val = evaluate(step_fns.eval, run.setup.rng_state, state,
                           run.task.splits["validation"], run.eval_batch_size,
                           run.batch_sharding, train_cfg.eval_steps)
            if val["accuracy"] >= meta["best_val_accuracy"]:
                meta = {**meta, "best_val_accuracy": val["accuracy"], "best_step": step}
            meta = {**meta, "wall_time_s": base_time + time.perf_counter() - run_start}
            writer.write(step, "validation", val)
            reporter.validation(step, val, meta["best_val_accuracy"])
            run.checkpoints.save(step, state, meta, val["accuracy"])
            window_start = time.perf_counter()
        if stop.signum is not None:
            if not is_eval:
                meta = {**meta, "wall_time_s": base_time + time.perf_counter() - run_start}
                saved = {**meta, UNLOGGED_WINDOW: host_window(window)} if window else meta
                run.checkpoints.save(step, state, saved, None)
            raise TrainingInterrupted(step, stop.signum)
    return state, meta


def _log_extension(entry: dict[str, Any], writer: MetricWriter, reporter: Reporter) -> None:
    """Writes the ``"extend"`` record to ``metrics.jsonl`` and says so on the console."""
    writer.write(entry["at_step"], "extend",
                 {"from_steps": entry["from_steps"], "to_steps": entry["to_steps"]})
    if reporter.enabled:
        reporter.console.print(
            f"Extending the run from {entry['from_steps']} to {entry['to_steps']} steps; the "
            f"schedule is re-evaluated for {entry['to_steps']} steps.", highlight=False)


def _summarize(window: list[dict[str, jax.Array]], seconds: float, step: int) -> dict[str, float]:
    host = jax.device_get(window)
    finite = np.array([m["finite"] for m in host])
    if not finite.all():
        bad = step - len(host) + 1 + int(np.argmin(finite))
        raise TrainingDiverged(
            f"training loss is NaN or inf at step {bad}; stopped. The last good checkpoint "
            f"(at or before step {step - len(host)}) is kept. Lower train.optimizer."
            f"learning_rate or set train.grad_clip_norm."
        )
    total = {k: float(sum(m[k] for m in host)) for k in ("loss_sum", "correct", "count", "tokens")}
    lm = {"bits_per_byte": bits_per_byte({"bits_sum": sum(m["bits_sum"] for m in host),
                                         "count": total["count"]})} if "bits_sum" in host[0] else {}
    return {
        **lm,
        "loss": total["loss_sum"] / total["count"],
        "accuracy": total["correct"] / total["count"],
        "grad_norm": float(np.mean([m["grad_norm"] for m in host])),
        "learning_rate": float(host[-1]["learning_rate"]),
        "examples_per_s": total["count"] / seconds,
        "tokens_per_s": total["tokens"] / seconds,
    }


def evaluate(
    eval_step, rng_state, state, split, batch_size: int, sharding, max_batches: int = -1
) -> dict[str, float]:
    """Loss and accuracy of ``state`` on ``split`` (all of it when ``max_batches`` is -1).

    The last partial batch is padded with weight-0 rows, so every batch has the same shape and
    the step compiles once.

    Returns:
        ``{"loss", "accuracy", "count"}``, loss in nats per example.

    Example:
        ``evaluate(run.setup.steps.eval, run.setup.rng_state, state, run.task.splits["test"],
        64, run.batch_sharding)``; see :func:`evaluate_checkpoint`.
    """
    sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    batches: Iterator = data.iterate_batches(split, batch_size, shuffle=False)
    outputs = []
    for i, batch in enumerate(batches):
        if i == max_batches:
            break
        outputs.append(eval_step(rng_state, state, distributed.global_batch(batch, sharding)))
    host = jax.device_get(outputs)
    if host and "bits_sum" in host[0]:  # the next-token objective
        sums["bits_sum"] = 0.0
    for out in host:
        for key in sums:
            sums[key] += float(out[key])
    count = max(sums["count"], 1.0)
    lm = {"bits_per_byte": bits_per_byte(sums)} if "bits_sum" in sums else {}
    return {**lm, "loss": sums["loss_sum"] / count, "accuracy": sums["correct"] / count,
            "count": int(sums["count"])}


def _final_evaluation(run: run_lib.Run, state: nnx.State, meta: Meta) -> dict[str, Any]:
    config, step_fns, rng_state = run.config, run.setup.steps, run.setup.rng_state
    run.checkpoints.wait()
    test = run.task.splits["test"]
    final = evaluate(step_fns.eval, rng_state, state, test, run.eval_batch_size,
                     run.batch_sharding)
    best_step = int(meta["best_step"])
    if best_step in (config.train.steps, 0):
        best = final
    else:
        best_state, _ = run.checkpoints.restore(best_step, state)
        best = evaluate(step_fns.eval, rng_state, best_state, test, run.eval_batch_size,
                        run.batch_sharding)
    return {
        "task": config.task,
        "attention": config.model.attention,
        "protocol": config.protocol,
        "seed": config.seed,
        "steps": config.train.steps,
        "wall_time_s": float(meta["wall_time_s"]),
        "best_step": best_step,
        "best_val_accuracy": float(meta["best_val_accuracy"]),
        "test_accuracy": best["accuracy"],
        "test_loss": best["loss"],
        "final_test_accuracy": final["accuracy"],
        "final_test_loss": final["loss"],
        **({"init_from_step": int(meta["init_from_step"])} if "init_from_step" in meta
           else {}),
        "majority_baseline": data.majority_baseline(test),
        "test_examples": final["count"],
        **({"test_bits_per_byte": best["bits_per_byte"],
            "final_test_bits_per_byte": final["bits_per_byte"]} if "bits_per_byte" in final
           else {}),
    }


def _resolved(config: ml_collections.ConfigDict, model_cfg) -> dict[str, Any]:
    out = config.to_dict()
    out["model"].update(vocab_size=model_cfg.vocab_size, num_classes=model_cfg.num_classes,
                        max_length=model_cfg.max_length)
    return out


def evaluate_checkpoint(
    workdir: str, *, checkpoint: str = "best", split: str = "test"
) -> dict[str, Any]:
    """Evaluates a saved checkpoint of the run in ``workdir`` on one split.

    Args:
        workdir: a run directory written by :func:`train_and_evaluate`.
        checkpoint: ``"best"`` (highest validation accuracy), ``"latest"`` or a step number.
        split: ``"train"``, ``"validation"`` or ``"test"``.

    Returns:
        ``{"step", "split", "loss", "accuracy", "count", "majority_baseline"}``.

    Raises:
        FileNotFoundError: no run or no checkpoint in ``workdir``, or the data is missing.
        spectral_jax.UsageError: an unknown ``split`` or ``checkpoint`` value.

    Example:
        ``spectral-jax eval --workdir runs/x --checkpoint latest`` prints
        ``evaluate_checkpoint("runs/x", checkpoint="latest")``.
    """
    _checks.choice("evaluate_checkpoint", "split", split, data.SPLIT_NAMES)
    run, state, step = run_lib.restore_for_evaluation(workdir, checkpoint)
    with jax.set_mesh(run.mesh):
        result = evaluate(run.setup.steps.eval, run.setup.rng_state, state,
                          run.task.splits[split], run.eval_batch_size, run.batch_sharding)
    return {"step": step, "split": split, **result,
            "majority_baseline": data.majority_baseline(run.task.splits[split])}
