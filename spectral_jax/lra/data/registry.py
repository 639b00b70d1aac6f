"""The task registry: one entry per LRA task with its title, reader and optional generator.

Everything that lists tasks (configs, the results table, ``spectral-jax data info``) reads
:data:`TASKS` / :func:`get_task_spec`; adding a task is one :class:`TaskSpec` here (see
CONTRIBUTING.md).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.lra.data import (
    bytes_docs,
    bytes_lm,
    image,
    listops,
    listops_generator,
    mqar,
    pathfinder,
    retrieval,
    text,
)
from spectral_jax.lra.data.task import Task

# Written next to generated files: the settings that made them.
GENERATED_FILE = "generated.json"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: how to read it and, when it can be made locally, how to generate it.

    Attributes:
        name: registry name (its config ``lra/<name>``, ``config.task``).
        title: the name used in tables (``"Path-X"``).
        load: ``load(data_dir, **options) -> Task``; its keyword-only parameters are the task's
          options (:func:`task_options`).
        generate: ``generate(out_dir, **settings)`` writes the task's files into ``out_dir``;
          None when the data must be downloaded.
        generated_file: a file ``generate`` writes; its presence means the data exists.
        objective: what a model learns from it: ``"classification"`` (a label per example),
          ``"next_token"`` (a causal language model) or ``"token_targets"`` (a causal model
          scored where ``Split.targets`` is set); see ``spectral_jax.lra.train.objectives``.
    """

    name: str
    title: str
    load: Callable[..., Task]
    generate: Callable[..., Any] | None = None
    generated_file: str | None = None
    objective: str = "classification"


_SPECS = (
    TaskSpec("listops", "ListOps", listops.load, listops_generator.generate, "basic_train.tsv"),
    TaskSpec("text", "Text", text.load),
    TaskSpec("retrieval", "Retrieval", retrieval.load),
    TaskSpec("image", "Image", image.load),
    TaskSpec("pathfinder", "Pathfinder",
             functools.partial(pathfinder.load, resolution=32, name="pathfinder")),
    TaskSpec("pathx", "Path-X", functools.partial(pathfinder.load, resolution=128, name="pathx")),
    TaskSpec("bytes_lm", "Byte LM", bytes_lm.load, objective="next_token"),
    TaskSpec("bytes_docs", "Byte LM (documents)", bytes_docs.load, objective="token_targets"),
    TaskSpec("mqar", "MQAR", mqar.load, objective="token_targets"),
)
_REGISTRY: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}

TASKS = tuple(_REGISTRY)
# The Long Range Arena's classification tasks (each has a config, lra/<task>).
LRA_TASKS = tuple(spec.name for spec in _SPECS if spec.objective == "classification")
TITLES: dict[str, str] = {spec.name: spec.title for spec in _SPECS}


def get_task_spec(name: str) -> TaskSpec:
    """The :class:`TaskSpec` of ``name``.

    Raises:
        spectral_jax.UsageError: if `name` is not in `TASKS` (the message lists them).

    Example:
        >>> get_task_spec("pathx").title
        'Path-X'
    """
    if name not in _REGISTRY:
        raise UsageError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    return _REGISTRY[name]


def task_options(name: str) -> dict[str, object]:
    """The options `load_task(name, ...)` accepts, with their defaults.

    Raises:
        spectral_jax.UsageError: if `name` is not in `TASKS`.

    Example:
        >>> task_options("listops")
        {'max_length': 2000}
    """
    params = inspect.signature(get_task_spec(name).load).parameters
    return {k: p.default for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "name"}


def load_task(name: str, data_dir: str | os.PathLike, **options: object) -> Task:
    """Loads an LRA task from its on-disk release format.

    Options (all optional): listops `max_length=2000`; text `max_length=4000,
    val_fraction=0.1, seed=0`; retrieval `max_length=4000` (per document); image
    `source="auto"|"fashion_mnist"|"cifar10", mask_zero_pixels=False,
    test_examples=None`; pathfinder /
    pathx `resolution=32 / 128, difficulty="curv_contour_length_14",
    mask_zero_pixels=False, skip_unreadable=False`; bytes_lm `corpus="folder",
    context_length=256, heldout_fraction=0.05`; bytes_docs the same with
    `context_length=128, packed=True`; mqar `seq_len=64, num_kv_pairs=4,
    vocab_size=8192, num_train=100000, ...` (generated, `data_dir` not read). See each task
    module's `load`.

    Args:
        name: one of `TASKS`.
        data_dir: folder holding that task's files (layouts in the task modules).
        **options: task options above.

    Returns:
        `Task` with "train", "validation" and "test" splits of fixed-shape arrays.

    Raises:
        spectral_jax.UsageError: unknown task name, or bad data/option values.
        spectral_jax.UsageTypeError: an option the task does not accept (named in the message).
        FileNotFoundError: missing data; the message says where to put it or which
            `spectral-jax data ...` command generates it.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = listops_generator.generate(d, num_train=4, num_val=2, num_test=2, min_length=10,
        ...                      max_length=40)
        >>> load_task("listops", d, max_length=64).vocab_size
        17
    """
    allowed = task_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UsageTypeError(
            f"load_task({name!r}): unknown option(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(allowed) or 'none'}"
        )
    return _REGISTRY[name].load(data_dir, **options)


def prepare_data(
    name: str,
    data_dir: str | os.PathLike,
    settings: Mapping[str, Any] | None,
    *,
    write: bool = True,
    label: str = "settings",
    log: Callable[[str], None] = print,
) -> bool:
    """Generates task ``name`` into ``data_dir`` with ``settings`` unless it is already there.

    Generated data is recorded in ``data_dir/generated.json``; a folder generated with other
    settings is refused rather than silently reused. Files that were not generated here (a
    downloaded release) are used as they are. Nothing happens for ``settings=None``.

    Args:
        name: one of `TASKS` with a generator (ListOps).
        data_dir: where the files are, or go.
        settings: keyword arguments of the task's ``generate``; None: use what is there.
        write: generate when missing (False on every process but one of a multi-host run;
          the others only check).
        label: how messages name ``settings`` (the trainer says ``data.generate``).
        log: receives one line when data is generated or existing files are used.

    Returns:
        Whether data was generated.

    Raises:
        spectral_jax.UsageError: ``settings`` for a task without a generator, or ``data_dir``
          holding data generated with other settings.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> settings = dict(num_train=4, num_val=2, num_test=2, min_length=10, max_length=40)
        >>> prepare_data("listops", d, settings, log=lambda line: None)
        True
        >>> prepare_data("listops", d, settings)  # the same settings: reused
        False
    """
    if settings is None:
        return False
    spec = get_task_spec(name)
    if spec.generate is None:
        makers = [s.name for s in _SPECS if s.generate is not None]
        raise UsageError(f"{label} is set but task {name!r} has no generator (tasks with one: "
                         f"{', '.join(makers)}); download its data instead")
    settings = dict(settings)
    record = os.path.join(data_dir, GENERATED_FILE)
    if not os.path.exists(os.path.join(data_dir, spec.generated_file)):
        if not write:
            return False
        log(f"Generating {spec.title} data in {data_dir} ...")
        spec.generate(data_dir, **settings)
        with open(record, "w") as f:
            json.dump(settings, f, indent=2, sort_keys=True)
        return True
    if os.path.exists(record):
        with open(record) as f:
            made = json.load(f)
        if made != settings:
            first = next(k for k in sorted(set(made) | set(settings))
                         if made.get(k, "<missing>") != settings.get(k, "<missing>"))
            raise UsageError(
                f"data.dir={os.fspath(data_dir)!r} holds {spec.title} generated with different "
                f"settings ({label}.{first}: {made.get(first, '<missing>')!r} there, "
                f"{settings.get(first, '<missing>')!r} now); use another data.dir or delete "
                "that one"
            )
    elif write:
        log(f"Using the {spec.title} files already in {data_dir}; {label} is not used.")
    return False

