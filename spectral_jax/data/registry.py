"""`load_task`: one entry point that dispatches to the per-task readers."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable

from spectral_jax.data import image, listops, pathfinder, retrieval, text
from spectral_jax.data.task import Task

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")

_LOADERS: dict[str, Callable[..., Task]] = {
    "listops": listops.load,
    "text": text.load,
    "retrieval": retrieval.load,
    "image": image.load,
    "pathfinder": functools.partial(pathfinder.load, resolution=32, name="pathfinder"),
    "pathx": functools.partial(pathfinder.load, resolution=128, name="pathx"),
}


def task_options(name: str) -> dict[str, object]:
    """The options `load_task(name, ...)` accepts, with their defaults.

    Raises:
        ValueError: if `name` is not in `TASKS`.

    Example:
        >>> task_options("listops")
        {'max_length': 2000}
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    params = inspect.signature(_LOADERS[name]).parameters
    return {k: p.default for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "name"}


def load_task(name: str, data_dir: str | os.PathLike, **options: object) -> Task:
    """Loads an LRA task from its on-disk release format.

    Options (all optional): listops `max_length=2000`; text `max_length=4000,
    val_fraction=0.1, seed=0`; retrieval `max_length=4000` (per document); image
    `source="auto"|"fashion_mnist"|"cifar10", mask_zero_pixels=False,
    test_examples=None`; pathfinder /
    pathx `resolution=32 / 128, difficulty="curv_contour_length_14",
    mask_zero_pixels=False, skip_unreadable=False`. See each task module's `load`.

    Args:
        name: one of `TASKS`.
        data_dir: folder holding that task's files (layouts in the task modules).
        **options: task options above.

    Returns:
        `Task` with "train", "validation" and "test" splits of fixed-shape arrays.

    Raises:
        ValueError: unknown task name, or bad data/option values.
        TypeError: an option the task does not accept (named in the message).
        FileNotFoundError: missing data; the message says where to put it or which
            `spectral-jax data ...` command generates it.

    Example:
        >>> import tempfile
        >>> from spectral_jax.data import listops
        >>> d = tempfile.mkdtemp()
        >>> _ = listops.generate(d, num_train=4, num_val=2, num_test=2, min_length=10,
        ...                      max_length=40)
        >>> load_task("listops", d, max_length=64).vocab_size
        17
    """
    allowed = task_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"load_task({name!r}): unknown option(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(allowed) or 'none'}"
        )
    return _LOADERS[name](data_dir, **options)
