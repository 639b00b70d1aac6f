"""`bench compile`: time to trace, lower and compile one training step, per method.

The program is the real one: the model of a training config (by default the quick ListOps
preset) and the jitted step of :func:`spectral_jax.lra.train.steps.make_steps`, lowered on
abstract inputs (``jax.ShapeDtypeStruct``), so nothing is initialised or run. Each repeat
builds a fresh step function, so neither the tracing cache nor the executable cache of an
earlier repeat is reused.
"""

from __future__ import annotations

import dataclasses
import importlib
import statistics
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from spectral_jax import UsageError
from spectral_jax.attention import BASELINE, available_attentions

# The configuration `bench compile` and the accelerator-lowering test use by default.
DEFAULT_CONFIG = "lra/listops:quick"


@dataclasses.dataclass(frozen=True)
class TrainStepProgram:
    """One method's jitted training step and the abstract arguments it is lowered on.

    Attributes:
      step: the jitted ``(rng_state, state, batch) -> (state, metrics)``.
      args: ``(rng_state, state, batch)`` as ``jax.ShapeDtypeStruct`` pytrees.
      num_params: trainable parameters of the model.
    """

    step: Callable[..., Any]
    args: tuple[Any, Any, Any]
    num_params: int


def _task_sizes(config: ml_collections.ConfigDict) -> types.SimpleNamespace:
    """The task sizes ``model_config`` needs, from the config and the task module's constants
    (no data is read)."""
    module = importlib.import_module(f"spectral_jax.lra.data.{config.task}")
    m = config.model
    sizes = {"vocab_size": m.vocab_size or getattr(module, "VOCAB_SIZE", None),
             "num_classes": m.num_classes or getattr(module, "NUM_CLASSES", None),
             "max_length": m.max_length}
    missing = [k for k, v in sizes.items() if v is None]
    if missing:
        raise UsageError(f"config task {config.task!r}: set model.{missing[0]} (the task "
                         "module defines no constant for it, and no data is read here)")
    return types.SimpleNamespace(**sizes)


def train_step_program(config: ml_collections.ConfigDict) -> TrainStepProgram:
    """The training step of ``config`` on one device, ready for ``step.lower(*args)``.

    Args:
      config: a training config (``spectral_jax.lra.train.overrides.load_config``); its task must be
        single-document (ListOps, text, image, Pathfinder).

    Returns:
      :class:`TrainStepProgram`.

    Raises:
      spectral_jax.UsageError: a size the model needs is neither in the config nor a task constant.

    Example:
      >>> from spectral_jax.lra.train.overrides import load_config
      >>> prog = train_step_program(load_config("lra/listops:quick,attention=local"))
      >>> prog.args[2]["inputs"].shape
      (32, 128)
    """
    from spectral_jax.lra.train import distributed
    from spectral_jax.lra.train import steps as steps_lib

    model_cfg = steps_lib.model_config(config, _task_sizes(config))
    tx = steps_lib.make_optimizer(config)

    def create():
        model = steps_lib.build_model(model_cfg, False, config.seed)
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    abstract = nnx.eval_shape(create)
    graphdef, rng_state, state = nnx.split(abstract, nnx.RngState, ...)
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(abstract[0], nnx.Param)))
    mesh = distributed.make_mesh(jax.devices()[:1])
    steps = steps_lib.make_steps(
        graphdef, config.seed, distributed.replicated(mesh), distributed.batch_sharding(mesh),
        steps_lib.make_schedule(config), config.train.redraw_features_every)
    b, n = config.train.batch_size, model_cfg.max_length
    batch = {"inputs": jax.ShapeDtypeStruct((b, n), jnp.int32),
             "mask": jax.ShapeDtypeStruct((b, n), jnp.bool_),
             "label": jax.ShapeDtypeStruct((b,), jnp.int32),
             "weight": jax.ShapeDtypeStruct((b,), jnp.float32)}
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          (nnx.to_pure_dict(rng_state), nnx.to_pure_dict(state)))
    nnx.replace_by_pure_dict(rng_state, shapes[0])
    nnx.replace_by_pure_dict(state, shapes[1])
    return TrainStepProgram(steps.train, (rng_state, state, batch), int(num_params))


def time_compile(config: ml_collections.ConfigDict) -> dict[str, float]:
    """Seconds to trace and lower, and to compile, the training step of ``config`` once."""
    program = train_step_program(config)
    # Process CPU time (all threads): unlike wall time it barely moves when other processes
    # share the cores.
    start = time.process_time()
    wall = time.perf_counter()
    lowered = program.step.lower(*program.args)
    lowered_at = time.process_time()
    compiled = lowered.compile()
    done = time.process_time()
    return {"lower_s": lowered_at - start, "compile_s": done - lowered_at,
            "total_s": done - start, "wall_s": time.perf_counter() - wall,
            "num_params": program.num_params,
            # Program sizes, unchanged by load: StableHLO operations as lowered, and HLO
            # instructions after XLA's optimisations.
            "stablehlo_ops": lowered.as_text().count(" = "),
            "hlo_instructions": compiled.as_text().count(" = ")}


def run_compile(
    config_spec: str = DEFAULT_CONFIG, methods: Sequence[str] | None = None, repeats: int = 1,
    progress: Callable[[str], Any] = lambda _: None,
) -> list[dict[str, Any]]:
    """The compile time of every method's training step, and its ratio to softmax's.

    Args:
      config_spec: ``FILE.py[:ARG]`` of a training config; ``attention=`` is set per method.
      methods: registered names (default: all); softmax is always included, first.
      repeats: compiles per method; the minimum (the least disturbed by machine load) is
        reported, with every reading kept.
      progress: called with one line per compile.

    Returns:
      One record per method: ``method``, ``lower_s``, ``compile_s``, ``total_s`` (process
      CPU seconds) and ``wall_s`` (minimum over repeats of each), ``totals`` (every
      repeat), ``num_params`` and ``ratio`` (``total_s`` / softmax's).

    Raises:
      spectral_jax.UsageError: ``repeats`` below 1, or an unknown method.
    """
    from spectral_jax import _checks
    from spectral_jax.attention import get_attention_spec

    _checks.positive_int("run_compile()", "repeats", repeats)
    names = list(available_attentions()) if methods is None else list(methods)
    for name in names:
        get_attention_spec(name)
    names = [BASELINE] + [n for n in names if n != BASELINE]
    path, _, arg = config_spec.partition(":")
    # A persistent compilation cache would hand back the first repeat's executable (or a
    # previous run's): every reading must be a real compile.
    cache_was_on = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        records = _compile_records(path, arg, names, repeats, progress)
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_was_on)
    base = records[0]["total_s"]
    for record in records:
        record["ratio"] = record["total_s"] / base
    return records


def _compile_records(path: str, arg: str, names: Sequence[str], repeats: int,
                     progress: Callable[[str], Any]) -> list[dict[str, Any]]:
    from spectral_jax.lra.train.overrides import load_config

    records = []
    # One untimed compile first: the process's first compile also pays one-time costs
    # (XLA's pass pipelines, Flax's graph caches) that would otherwise count against softmax.
    time_compile(load_config(f"{path}:{arg + ',' if arg else ''}attention={BASELINE}"))
    for name in names:
        config = load_config(f"{path}:{arg + ',' if arg else ''}attention={name}")
        readings = []
        for r in range(repeats):
            readings.append(time_compile(config))
            progress(f"{name}: lower {readings[-1]['lower_s']:.2f} s, compile "
                     f"{readings[-1]['compile_s']:.2f} s (repeat {r + 1}/{repeats})")
        record = {"method": name, "num_params": readings[0]["num_params"],
                  "stablehlo_ops": readings[0]["stablehlo_ops"],
                  "hlo_instructions": readings[0]["hlo_instructions"],
                  "totals": [x["total_s"] for x in readings],
                  "median_total_s": statistics.median(x["total_s"] for x in readings)}
        record.update({k: min(x[k] for x in readings)
                       for k in ("lower_s", "compile_s", "total_s", "wall_s")})
        records.append(record)
    return records


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """The records of :func:`run_compile` as a Markdown table, slowest ratio last.

    Example:
      >>> table = markdown_table([{"method": "softmax", "lower_s": 0.5, "compile_s": 4.0,
      ...                          "total_s": 4.5, "ratio": 1.0}])
      >>> print(table.splitlines()[0][:48])
      | method | lower (s) | compile (s) | total (s) |
      >>> print(table.splitlines()[2])
      | softmax | 0.50 | 4.00 | 4.50 | 1.00 |  |  |
    """
    lines = ["| method | lower (s) | compile (s) | total (s) | × softmax | StableHLO ops "
             "| HLO instructions |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(records, key=lambda r: r["ratio"]):
        lines.append(f"| {r['method']} | {r['lower_s']:.2f} | {r['compile_s']:.2f} | "
                     f"{r['total_s']:.2f} | {r['ratio']:.2f} | {r.get('stablehlo_ops', '')} "
                     f"| {r.get('hlo_instructions', '')} |")
    return "\n".join(lines)


def write_markdown(path: str, records: Sequence[dict[str, Any]],
                   payload: dict[str, Any]) -> str:
    """Writes the table with the command's settings and the machine's load; returns ``path``."""
    import os

    env, config = payload["environment"], payload["config"]
    load = ", ".join(f"{x:.2f}" for x in env["load_average"])
    text = (f"# Training-step compile time, {config['config']}\n\n"
            f"Process CPU seconds (all threads) to trace + lower and XLA-compile one jitted "
            f"training step "
            f"(`spectral_jax.lra.train.steps.make_steps`), minimum of {config['repeats']} "
            f"repeat(s) per method, after one untimed warm-up compile. JAX {env['jax']}, "
            f"{env['backend']} ({env['device']}), {env['cpu_count']} CPU cores, load average "
            f"{load} when the run ended. Ratios within one run are what counts: absolute "
            "seconds move with machine load.\n\n" + markdown_table(records) + "\n")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path
