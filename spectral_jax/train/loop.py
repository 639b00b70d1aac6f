"""``train_and_evaluate(config, workdir)``: the LRA training loop, in the Flax gemma/mnist style."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np
from flax import nnx

from spectral_jax.train import checkpoint as checkpoint_lib
from spectral_jax.train import distributed, optim, run_stats, steps as steps_lib
from spectral_jax.train.config_lib import validate_config
from spectral_jax.train.progress import Reporter
from spectral_jax.train.writers import MetricWriter

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"
# Written next to generated ListOps files: the data.generate settings that made them.
GENERATED_FILE = "generated.json"
# Files a run owns in its workdir; --overwrite removes exactly these.
_RUN_FILES = (CONFIG_FILE, RESULTS_FILE, CHECKPOINT_DIR, "metrics.jsonl", "tensorboard")


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or inf; the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """A freshly initialised run placed on a mesh.

    Attributes:
        graphdef: the ``(model, optimizer)`` graph.
        rng_state: the model's RNG streams (replicated; reseeded inside every step).
        state: model and optimizer state without RNG streams (replicated); what is checkpointed.
        steps: the jitted train and eval steps.
        num_params: trainable parameter count.
    """

    graphdef: nnx.GraphDef
    rng_state: nnx.State
    state: nnx.State
    steps: steps_lib.Steps
    num_params: int


def setup_run(
    config: ml_collections.ConfigDict, model_cfg, dual: bool, mesh: jax.sharding.Mesh
) -> RunSetup:
    """Builds model and optimizer from ``config.seed`` and replicates them over ``mesh``.

    Call inside ``jax.set_mesh(mesh)``.

    Args:
        config: the training config (for the seed).
        model_cfg: the :class:`spectral_jax.nn.TransformerConfig`.
        dual: build the dual-encoder classifier (retrieval).
        mesh: a 1-D data mesh (:func:`spectral_jax.train.distributed.make_mesh`).

    Returns:
        :class:`RunSetup`.

    Example:
        >>> # see tests/test_train_loop.py::test_eight_devices_match_one
    """
    tx = optim.make_optimizer(config)

    def create():
        model = steps_lib.build_model(model_cfg, dual, config.seed)
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    # Initialising inside one jit compiles once, instead of once per eager op, and creates
    # the state directly replicated on the mesh.
    abstract_model, abstract_opt = nnx.eval_shape(create)
    graphdef = nnx.graphdef((abstract_model, abstract_opt))
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(abstract_model, nnx.Param)))
    replicated = distributed.replicated(mesh)
    rng_state, state = jax.jit(
        lambda: nnx.split(create(), nnx.RngState, ...)[1:], out_shardings=replicated
    )()
    steps = steps_lib.make_steps(
        graphdef, config.seed, replicated, distributed.batch_sharding(mesh),
        optim.make_schedule(config), config.train.redraw_features_every,
    )
    return RunSetup(graphdef, rng_state, state, steps, int(num_params))


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *, overwrite: bool = False
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its last checkpoint, and evaluates on test.

    Evaluates on the validation split every ``train.eval_every`` steps and checkpoints there
    (orbax, the last ``train.keep_checkpoints`` plus the best). At the end both the final and the
    best-validation parameters are evaluated on the test split, next to the test split's
    majority-class baseline, and everything lands in ``workdir/results.json``. A run killed at
    any point and started again with the same config continues from its last checkpoint with the
    same data order and randomness, and ``metrics.jsonl`` reads as if it had never stopped.

    Args:
        config: a config from ``configs/lra/*.py`` (see :mod:`spectral_jax.train.config_lib`).
        workdir: run directory (created). Holding a different config, it is refused.
        overwrite: delete a previous run's files in ``workdir`` first.

    Returns:
        The contents of ``results.json``: ``test_accuracy`` (best-validation checkpoint),
        ``final_test_accuracy``, ``majority_baseline``, ``best_step``, ``steps``,
        ``wall_time_s``, ``num_params``, the training rate (``examples_per_s``,
        ``tokens_per_s``, ``steps_per_s``: median over the logged windows after the first),
        ``train_step_peak_bytes`` (the compiled train step's peak memory per device), ``compiles``
        and the resolved ``config``.

    Raises:
        ValueError: invalid config (unknown task, method or protocol; batch size not divisible
          by the device count; ...), or ``workdir`` holding a different config. Raised before
          anything is compiled.
        FileNotFoundError: the task's data directory is missing (the message says how to get it).
        TrainingDiverged: the loss became non-finite (the message names the step).

    Example:
        >>> # python -m spectral_jax.cli train --config configs/lra/listops.py:quick --workdir w
        >>> # or: train_and_evaluate(listops.get_config("quick"), "runs/listops_quick")
    """
    from spectral_jax import data as data_lib

    config = ml_collections.ConfigDict(config.to_dict())
    validate_config(config)
    # Absolute, so that `eval` finds the data from any working directory.
    config.data.dir = os.path.abspath(config.data.dir)
    mesh = distributed.make_mesh()
    train_cfg = config.train
    eval_batch_size = train_cfg.eval_batch_size or train_cfg.batch_size
    distributed.check_batch_size("train.batch_size", train_cfg.batch_size, mesh)
    distributed.check_batch_size("train.eval_batch_size", eval_batch_size, mesh)
    optim.make_optimizer(config)  # raises on bad optimizer settings before any work
    is_main = jax.process_index() == 0
    if not overwrite:
        _check_workdir(workdir, config)
    task = _load_task(config, is_main)
    model_cfg = steps_lib.model_config(config, task)

    with jax.set_mesh(mesh):
        setup = setup_run(config, model_cfg, task.dual, mesh)
        rng_state, state, step_fns = setup.rng_state, setup.state, setup.steps
        batch_sharding = distributed.batch_sharding(mesh)
        # Tracing one step (no compile) raises model and attention errors (heads not
        # dividing qkv_dim, bad method parameters) before the workdir is claimed, so the
        # fixed command can rerun in the same workdir.
        probe = distributed.global_batch(
            next(data_lib.iterate_batches(task.splits["train"], train_cfg.batch_size,
                                          shuffle=False)),
            batch_sharding)
        jax.eval_shape(step_fns.train, rng_state, state, probe)
        if is_main:
            _write_workdir(workdir, config, overwrite=overwrite)
        ckpt = checkpoint_lib.Checkpointer(
            os.path.join(workdir, CHECKPOINT_DIR), keep=train_cfg.keep_checkpoints
        )
        meta = {"best_val_accuracy": -1.0, "best_step": 0, "wall_time_s": 0.0}
        start_step = ckpt.latest_step()
        if start_step is not None:
            state, meta = ckpt.restore(start_step, state)
        writer = MetricWriter(workdir, enabled=is_main, resume_step=start_step)
        reporter = Reporter(train_cfg.steps, start=start_step or 0, enabled=is_main)
        try:
            state, meta = _train(
                config, task, step_fns, rng_state, state, meta, start_step or 0, ckpt, writer,
                reporter, eval_batch_size, batch_sharding,
            )
            results = _final_evaluation(
                config, task, step_fns, rng_state, state, meta, ckpt, eval_batch_size,
                batch_sharding,
            )
            # The cost side of the result (what a sweep's table compares methods on).
            results.update(
                **run_stats.training_throughput(workdir, train_cfg.batch_size),
                train_step_peak_bytes=run_stats.step_peak_bytes(
                    step_fns.train, rng_state, state, probe),
            )
        finally:
            reporter.close()
            writer.close()
            ckpt.close()

    results.update(
        num_params=setup.num_params,
        num_devices=mesh.devices.size,
        num_processes=jax.process_count(),
        compiles={"train": step_fns.train._cache_size(), "eval": step_fns.eval._cache_size()},
        data_source=task.source,
        config=_resolved(config, model_cfg),
    )
    if is_main:
        with open(os.path.join(workdir, RESULTS_FILE), "w") as f:
            json.dump(results, f, indent=2)
    reporter.summary(results)
    return results


def _train(config, task, step_fns, rng_state, state, meta, start_step, ckpt, writer, reporter,
           eval_batch_size, batch_sharding):
    from spectral_jax import data

    train_cfg = config.train
    batches = data.iterate_batches(
        task.splits["train"], train_cfg.batch_size, shuffle=True, seed=config.seed,
        start_step=start_step, repeat=True,
    )
    window: list[dict[str, jax.Array]] = []
    window_start = time.perf_counter()
    run_start = time.perf_counter()
    base_time = float(meta["wall_time_s"])
    for step in range(start_step + 1, train_cfg.steps + 1):
        batch = distributed.global_batch(next(batches), batch_sharding)
        state, metrics = step_fns.train(rng_state, state, batch)
        window.append(metrics)
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
            val = evaluate(step_fns.eval, rng_state, state, task.splits["validation"],
                           eval_batch_size, batch_sharding, train_cfg.eval_steps)
            if val["accuracy"] >= meta["best_val_accuracy"]:
                meta = {**meta, "best_val_accuracy": val["accuracy"], "best_step": step}
            meta = {**meta, "wall_time_s": base_time + time.perf_counter() - run_start}
            writer.write(step, "validation", val)
            reporter.validation(step, val, meta["best_val_accuracy"])
            ckpt.save(step, state, meta, val["accuracy"])
            window_start = time.perf_counter()
    return state, meta


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
    return {
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
        >>> # see train_and_evaluate
    """
    from spectral_jax import data

    sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    batches: Iterator = data.iterate_batches(split, batch_size, shuffle=False)
    outputs = []
    for i, batch in enumerate(batches):
        if i == max_batches:
            break
        outputs.append(eval_step(rng_state, state, distributed.global_batch(batch, sharding)))
    for out in jax.device_get(outputs):
        for key in sums:
            sums[key] += float(out[key])
    count = max(sums["count"], 1.0)
    return {"loss": sums["loss_sum"] / count, "accuracy": sums["correct"] / count,
            "count": int(sums["count"])}


def _final_evaluation(config, task, step_fns, rng_state, state, meta, ckpt, eval_batch_size,
                      sharding) -> dict[str, Any]:
    from spectral_jax import data

    ckpt.wait()
    test = task.splits["test"]
    final = evaluate(step_fns.eval, rng_state, state, test, eval_batch_size, sharding)
    best_step = int(meta["best_step"])
    if best_step in (config.train.steps, 0):
        best = final
    else:
        best_state, _ = ckpt.restore(best_step, state)
        best = evaluate(step_fns.eval, rng_state, best_state, test, eval_batch_size, sharding)
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
        "majority_baseline": data.majority_baseline(test),
        "test_examples": final["count"],
    }


def _resolved(config: ml_collections.ConfigDict, model_cfg) -> dict[str, Any]:
    out = config.to_dict()
    out["model"].update(vocab_size=model_cfg.vocab_size, num_classes=model_cfg.num_classes,
                        max_length=model_cfg.max_length)
    return out


def _check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        existing = json.load(f)
    wanted = json.loads(config.to_json(sort_keys=True))
    if existing != wanted:
        raise ValueError(
            f"workdir={workdir!r} holds a run with a different config "
            f"({_diff(existing, wanted)}); use another --workdir, or --overwrite to delete that run"
        )


def _write_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
    if overwrite:
        for name in _RUN_FILES:
            target = os.path.join(workdir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.remove(target)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
        f.write(config.to_json(sort_keys=True, indent=2))


def _diff(old: Any, new: Any, prefix: str = "") -> str:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key, "<missing>") != new.get(key, "<missing>"):
                return _diff(old.get(key, "<missing>"), new.get(key, "<missing>"),
                             f"{prefix}{key}.")
    return f"{prefix.rstrip('.')}: {old!r} there, {new!r} now"


def _load_task(config: ml_collections.ConfigDict, is_main: bool):
    from spectral_jax import data

    cfg = config.data
    if cfg.generate is not None:
        if config.task != "listops":
            raise ValueError(
                f"data.generate is set but task={config.task!r}; only listops can be generated"
            )
        settings = cfg.generate.to_dict()
        record = os.path.join(cfg.dir, GENERATED_FILE)
        if not os.path.exists(os.path.join(cfg.dir, "basic_train.tsv")):
            if is_main:
                print(f"Generating ListOps data in {cfg.dir} ...", flush=True)
                data.listops.generate(cfg.dir, **settings)
                with open(record, "w") as f:
                    json.dump(settings, f, indent=2, sort_keys=True)
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("listops generated")
        elif os.path.exists(record):
            with open(record) as f:
                made = json.load(f)
            if made != settings:
                raise ValueError(
                    f"data.dir={cfg.dir!r} holds ListOps generated with different settings "
                    f"({_diff(made, settings, 'data.generate.')}); use another data.dir or "
                    "delete that one"
                )
        elif is_main:
            print(f"Using the ListOps files already in {cfg.dir}; data.generate is not used.",
                  flush=True)
    try:
        task = data.load_task(config.task, cfg.dir, **cfg.options.to_dict())
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e}\n(data.dir={cfg.dir!r} comes from the config; point it elsewhere with "
            f"--config.data.dir=PATH)"
        ) from e
    for name, split in task.splits.items():
        if not len(split):
            raise ValueError(f"the {name} split in data.dir={cfg.dir!r} has no examples")
    return task


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
        ValueError: an unknown ``split`` or ``checkpoint`` value.

    Example:
        >>> # evaluate_checkpoint("runs/listops_quick", checkpoint="latest")
    """
    from spectral_jax import data

    if split not in ("train", "validation", "test"):
        raise ValueError(f"split={split!r} is unknown; allowed: ['train', 'validation', 'test']")
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no run in workdir={workdir!r} ({CONFIG_FILE} is missing)")
    with open(path) as f:
        config = ml_collections.ConfigDict(json.load(f))
    validate_config(config)
    mesh = distributed.make_mesh()
    eval_batch_size = config.train.eval_batch_size or config.train.batch_size
    distributed.check_batch_size("train.eval_batch_size", eval_batch_size, mesh)
    task = _load_task(config, jax.process_index() == 0)
    model_cfg = steps_lib.model_config(config, task)
    with jax.set_mesh(mesh):
        setup = setup_run(config, model_cfg, task.dual, mesh)
        rng_state, state, step_fns = setup.rng_state, setup.state, setup.steps
        ckpt = checkpoint_lib.Checkpointer(
            os.path.join(workdir, CHECKPOINT_DIR), keep=config.train.keep_checkpoints
        )
        try:
            latest = ckpt.latest_step()
            if latest is None:
                raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)}")
            if checkpoint in ("best", "latest"):
                step = latest
            else:
                try:
                    step = int(checkpoint)
                except ValueError:
                    raise ValueError(
                        f"checkpoint={checkpoint!r} must be 'best', 'latest' or a step number"
                    ) from None
            state, meta = ckpt.restore(step, state)
            if checkpoint == "best" and int(meta["best_step"]) != step:
                step = int(meta["best_step"])
                state, _ = ckpt.restore(step, state)
        finally:
            ckpt.close()
        result = evaluate(step_fns.eval, rng_state, state, task.splits[split], eval_batch_size,
                          distributed.batch_sharding(mesh))
    return {"step": step, "split": split, **result,
            "majority_baseline": data.majority_baseline(task.splits[split])}
