"""A run's lifecycle: open it for training, or restore it for evaluation.

A run is a workdir holding ``config.json``, orbax checkpoints and logs. Both ways in go
through :func:`_assemble`, the one place that turns a config into task data, model config,
mesh, model and optimizer, jitted steps and a checkpoint manager:

* :func:`open_for_training` checks everything that can be checked before any compile,
  claims the workdir and returns a :class:`Run` ready to resume from its last checkpoint;
* :func:`restore_for_evaluation` rebuilds a saved run from its ``config.json`` and restores
  one checkpoint into it (``spectral-jax eval``, ``spectral-jax bench dump-qkv``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
from flax import nnx

from spectral_jax import UsageError, _checks
from spectral_jax.lra import data as data_lib
from spectral_jax.lra.train import checkpoint as checkpoint_lib
from spectral_jax.lra.train import distributed, objectives, warm_start
from spectral_jax.lra.train import pretrain as pretrain_lib
from spectral_jax.lra.train import steps as steps_lib
from spectral_jax.lra.train import workdir as workdir_lib
from spectral_jax.lra.train.config_lib import validate_config
from spectral_jax.nn import TransformerConfig

CHECKPOINT_CHOICES = "'best', 'latest' or a step number"


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
    config: ml_collections.ConfigDict, model_cfg: TransformerConfig, dual: bool,
    mesh: jax.sharding.Mesh,
) -> RunSetup:
    """Builds model and optimizer from ``config.seed`` and replicates them over ``mesh``.

    Call inside ``jax.set_mesh(mesh)``.

    Args:
        config: the training config (for the seed, optimizer and schedule).
        model_cfg: the :class:`spectral_jax.nn.TransformerConfig`.
        dual: build the dual-encoder classifier (retrieval).
        mesh: a 1-D data mesh (:func:`spectral_jax.lra.train.distributed.make_mesh`).

    Returns:
        :class:`RunSetup`.
    """
    tx = steps_lib.make_optimizer(config)
    objective = objectives.task_objective(config.task)

    def create():
        model = steps_lib.build_model(model_cfg, dual, config.seed,
                                      lm=objective in objectives.LANGUAGE_MODEL_OBJECTIVES)
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
        steps_lib.make_schedule(config), config.train.redraw_features_every,
        metrics=objectives.metrics_fn(objective),
    )
    return RunSetup(graphdef, rng_state, state, steps, int(num_params))


@dataclasses.dataclass
class Run:
    """An opened run: everything one training or evaluation pass needs, built once.

    Use it as a context manager (``with run:``): inside, ``jax.set_mesh(run.mesh)`` is active,
    and leaving closes the checkpoint manager (waiting for pending saves).

    Attributes:
        config: the validated config (``data.dir`` made absolute).
        workdir: the run directory.
        task: the loaded task data.
        model_config: the model's frozen config (sizes resolved from the task).
        mesh: the 1-D data mesh over every device.
        setup: model, optimizer and steps (:class:`RunSetup`).
        checkpoints: the run's checkpoint manager.
        eval_batch_size: ``train.eval_batch_size`` or, unset, ``train.batch_size``.
        is_main: this process writes logs and results (process 0).
        extension: the entry this opening added to ``extensions.json``
          (:func:`spectral_jax.lra.train.workdir.record_extension`), else None.
    """

    config: ml_collections.ConfigDict
    workdir: str
    task: data_lib.Task
    model_config: TransformerConfig
    mesh: jax.sharding.Mesh
    setup: RunSetup
    checkpoints: checkpoint_lib.Checkpointer
    eval_batch_size: int
    is_main: bool
    extension: dict[str, Any] | None = None

    @property
    def batch_sharding(self) -> jax.sharding.NamedSharding:
        return distributed.batch_sharding(self.mesh)

    def __enter__(self) -> Run:
        self._mesh_context = jax.set_mesh(self.mesh)
        self._mesh_context.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.checkpoints.close()
        finally:
            self._mesh_context.__exit__(*exc_info)


def load_task(config: ml_collections.ConfigDict, *, is_main: bool = True) -> data_lib.Task:
    """The config's task data, generated first when the task has a generator and it is missing.

    Args:
        config: a validated training config (``task``, ``data.dir``, ``data.options``,
          ``data.generate``).
        is_main: this process generates missing data (the others wait for it).

    Raises:
        FileNotFoundError: no data in ``data.dir`` (the message says how to get it).
        spectral_jax.UsageError: ``data.generate`` for a task without a generator; data
          generated with other settings; an empty split.
    """
    cfg = config.data
    settings = None if cfg.generate is None else cfg.generate.to_dict()
    data_lib.prepare_data(config.task, cfg.dir, settings, write=is_main, label="data.generate",
                          log=lambda line: print(line, flush=True))
    if settings is not None and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("task data prepared")
    try:
        task = data_lib.load_task(config.task, cfg.dir, **cfg.options.to_dict())
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e}\n(data.dir={cfg.dir!r} comes from the config; point it elsewhere with "
            f"--config.data.dir=PATH)"
        ) from e
    for name, split in task.splits.items():
        if not len(split):
            raise UsageError(f"the {name} split in data.dir={cfg.dir!r} has no examples")
    return task


def _assemble(config: ml_collections.ConfigDict, workdir: str, *, training: bool,
              overwrite: bool = False, extend: bool = False) -> Run:
    mesh = distributed.make_mesh(seq=config.train.mesh.seq if "mesh" in config.train else 1)
    eval_batch_size = config.train.eval_batch_size or config.train.batch_size
    if training:
        distributed.check_batch_size("train.batch_size", config.train.batch_size, mesh)
    distributed.check_batch_size("train.eval_batch_size", eval_batch_size, mesh)
    steps_lib.make_optimizer(config)  # raises on bad optimizer settings before any work
    if extend and overwrite:
        raise UsageError("extend and overwrite exclude each other: --extend continues the run "
                         "in --workdir, --overwrite deletes it")
    extends = workdir_lib.check_extension(workdir, config) if training and extend else None
    if training and not overwrite and extends is None:
        workdir_lib.check_workdir(workdir, config)
    is_main = jax.process_index() == 0
    task = load_task(config, is_main=is_main)
    model_cfg = pretrain_lib.model_config(config, steps_lib.model_config(config, task))
    with jax.set_mesh(mesh):
        setup = setup_run(config, model_cfg, task.dual, mesh)
        if training:
            # Tracing one step (no compile) raises model and attention errors (heads not
            # dividing qkv_dim, bad method parameters) before the workdir is claimed, so the
            # fixed command can rerun in the same workdir.
            first = next(data_lib.iterate_batches(task.splits["train"], config.train.batch_size,
                                                  shuffle=False))
            jax.eval_shape(setup.steps.train, setup.rng_state, setup.state,
                           distributed.global_batch(first, distributed.batch_sharding(mesh)))
    if training and warm_start.enabled(config):
        # Before the workdir is claimed: a wrong source leaves nothing to clean up.
        warm_start.check_source(config.train.init_from, workdir_lib.CHECKPOINT_DIR, workdir,
                                starts_fresh=overwrite or not os.path.isdir(
                                    os.path.join(workdir, workdir_lib.CHECKPOINT_DIR)))
    if training and is_main:
        workdir_lib.write_workdir(workdir, config, overwrite=overwrite)
    checkpoints = checkpoint_lib.Checkpointer(
        os.path.join(workdir, workdir_lib.CHECKPOINT_DIR), keep=config.train.keep_checkpoints
    )
    extension = None
    if extends is not None and is_main:
        extension = workdir_lib.record_extension(workdir, extends, config.train.steps,
                                                checkpoints.latest_step() or 0)
    return Run(config, workdir, task, model_cfg, mesh, setup, checkpoints, eval_batch_size,
               is_main, extension)


def open_for_training(
    config: ml_collections.ConfigDict, workdir: str, *, overwrite: bool = False,
    extend: bool = False,
) -> Run:
    """Checks ``config``, loads (or generates) its data, builds the run and claims ``workdir``.

    Everything that can fail on a bad config, missing data or a workdir holding another run
    fails here, before anything is compiled or written.

    Args:
        config: a training config (copied; ``data.dir`` is made absolute so that ``eval``
          finds the data from any working directory).
        workdir: the run directory (created; ``config.json`` written on process 0).
        overwrite: delete a previous run's files in ``workdir`` first.
        extend: continue the run in ``workdir`` to ``config.train.steps``
          (:mod:`spectral_jax.lra.train.workdir`).

    Returns:
        The :class:`Run`; enter it (``with run:``) to train.

    Raises:
        spectral_jax.UsageError: invalid config, ``workdir`` holding a different config (with
          ``extend``: differing in more than ``train.steps``, or fewer steps), or both
          ``extend`` and ``overwrite``.
        FileNotFoundError: the task's data is missing (the message says how to get it), or
          ``extend`` without a run in ``workdir``.
    """
    return _assemble(recorded_config(config), workdir, training=True, overwrite=overwrite,
                     extend=extend)


def recorded_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` as a run records it in ``config.json``: a checked copy, ``data.dir`` (and
    ``train.init_from``, if set) absolute.

    Raises:
        spectral_jax.UsageError: an invalid config (see :func:`validate_config`).
    """
    config = ml_collections.ConfigDict(config.to_dict())
    validate_config(config)
    config.data.dir = os.path.abspath(config.data.dir)
    if config.train.get("init_from"):
        config.train.init_from = os.path.abspath(config.train.init_from)
    return config


def restore_for_evaluation(
    workdir: str, checkpoint: str | int = "best"
) -> tuple[Run, nnx.State, int]:
    """Rebuilds the run in ``workdir`` and restores one of its checkpoints.

    Args:
        workdir: a run directory written by ``train_and_evaluate``.
        checkpoint: ``"best"`` (highest validation accuracy), ``"latest"`` or a step number.

    Returns:
        ``(run, state, step)``: the run (its checkpoint manager already closed; evaluate
        inside ``jax.set_mesh(run.mesh)``), the restored model and optimizer state, and the
        step it was saved at.

    Raises:
        FileNotFoundError: no run or no checkpoint in ``workdir``, or the data is missing.
        spectral_jax.UsageError: a ``checkpoint`` that is none of the above.
    """
    config = workdir_lib.read_config(workdir)
    validate_config(config)
    run = _assemble(config, workdir, training=False)
    # The checkpoint's number is checked before anything is restored.
    if checkpoint not in ("best", "latest"):
        try:
            wanted = int(checkpoint)
        except (TypeError, ValueError):
            run.checkpoints.close()
            raise UsageError(_checks.message("restore_for_evaluation", "checkpoint",
                                             CHECKPOINT_CHOICES, checkpoint)) from None
    with jax.set_mesh(run.mesh):
        try:
            step = run.checkpoints.latest_step()
            if step is None:
                pretraining = os.path.isdir(os.path.join(workdir, pretrain_lib.CHECKPOINT_DIR))
                raise FileNotFoundError(
                    f"no checkpoint in {os.path.join(workdir, workdir_lib.CHECKPOINT_DIR)}"
                    + ("; the run is still in its pretraining stage (the classifier is saved "
                       "from the fine-tune on): rerun its train command to go on" if pretraining
                       else ""))
            if checkpoint not in ("best", "latest"):
                step = wanted
            state, meta = run.checkpoints.restore(step, run.setup.state)
            if checkpoint == "best" and int(meta["best_step"]) != step:
                step = int(meta["best_step"])
                state, _ = run.checkpoints.restore(step, run.setup.state)
        finally:
            run.checkpoints.close()
    return run, state, step


