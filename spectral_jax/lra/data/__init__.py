"""LRA task data: numpy-only readers of the release formats, generators, batching.

One module per task (`listops`, `text`, `retrieval`, `image`, `pathfinder`, `bytes_lm`,
`mqar`), all
returning a `Task` of fixed-shape `Split`s; `load_task` dispatches by name and
`iterate_batches` yields fixed-shape, resumable batches (`iterate_length_buckets`: batched by
length, each cut to its longest example). The registry (`TASKS`,
`get_task_spec`) names each task, its title and its optional generator (`prepare_data`).
"""

from __future__ import annotations

from spectral_jax.lra import require

# Before the submodules import the harness's dependencies: one line naming the extra.
require()

from spectral_jax.lra.data import (  # noqa: E402
    image,
    listops,
    listops_generator,
    mqar,
    pathfinder,
    retrieval,
    text,
)
from spectral_jax.lra.data.batching import iterate_batches  # noqa: E402
from spectral_jax.lra.data.length_buckets import iterate_length_buckets  # noqa: E402
from spectral_jax.lra.data.registry import (  # noqa: E402
    TASKS,
    TITLES,
    TaskSpec,
    get_task_spec,
    load_task,
    prepare_data,
    task_options,
)
from spectral_jax.lra.data.task import (  # noqa: E402
    IGNORE_INDEX,
    SPLIT_NAMES,
    Split,
    Task,
    majority_baseline,
)

__all__ = [
    "IGNORE_INDEX",
    "SPLIT_NAMES",
    "TASKS",
    "TITLES",
    "TaskSpec",
    "Split",
    "Task",
    "get_task_spec",
    "image",
    "iterate_batches",
    "iterate_length_buckets",
    "listops",
    "listops_generator",
    "load_task",
    "majority_baseline",
    "mqar",
    "pathfinder",
    "prepare_data",
    "retrieval",
    "task_options",
    "text",
]
