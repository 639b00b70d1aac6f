"""Data parallelism over all devices and hosts, with JAX's own machinery.

One host, many devices: nothing to do; the trainer builds a 1-D ``("data",)`` mesh over
``jax.devices()``, replicates the state and splits each batch over the mesh.

Many hosts (GPU clusters, TPU pods): start the same command on every host, with
``SPECTRAL_JAX_DISTRIBUTED=1`` (or ``--distributed``). :func:`maybe_initialize` then calls
``jax.distributed.initialize()``, which finds the coordinator itself under Slurm, Open MPI,
Kubernetes (JobSet) and Cloud TPU; elsewhere set ``JAX_COORDINATOR_ADDRESS=host0:1234``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (the first is read by JAX, the other two
by :func:`maybe_initialize`). Every process reads the same
global batch sequence and feeds its own rows with
``jax.make_array_from_process_local_data``; process 0 writes the logs and ``results.json``,
and orbax coordinates the checkpoint writes. Example with two hosts::

    # on host 0 and host 1 (i = 0, 1):
    JAX_COORDINATOR_ADDRESS=10.0.0.1:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=$i \\
      spectral-jax train --distributed --config lra/text --workdir gs://bucket/run
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spectral_jax import UsageError, _checks

DATA_AXIS = "data"
# The mesh axis one sequence is split over (train.mesh.seq devices).
SEQ_AXIS = "seq"


def maybe_initialize(distributed: bool | None = None) -> bool:
    """Calls ``jax.distributed.initialize()`` when asked; must run before any device query.

    Args:
        distributed: True to initialize; None reads the ``SPECTRAL_JAX_DISTRIBUTED`` environment
          variable ("1"/"true").

    Returns:
        Whether ``jax.distributed.initialize()`` was called.

    Example:
        >>> maybe_initialize(False)
        False
    """
    if distributed is None:
        distributed = os.environ.get("SPECTRAL_JAX_DISTRIBUTED", "").lower() in ("1", "true")
    if distributed:
        # JAX reads JAX_COORDINATOR_ADDRESS itself but not the process count and id: without
        # a cluster manager to detect they must be passed explicitly.
        jax.distributed.initialize(
            num_processes=_env_int("JAX_NUM_PROCESSES"), process_id=_env_int("JAX_PROCESS_ID")
        )
    return bool(distributed)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"environment variable {name} must be an int; got {raw!r}") from None


def make_mesh(devices: list[jax.Device] | None = None, *, seq: int = 1) -> jax.sharding.Mesh:
    """A data-parallel mesh over ``devices`` (default: all devices of all hosts).

    With ``seq > 1`` (config ``train.mesh.seq``) the mesh is 2-D, ``(data, seq)`` of shape
    ``(devices // seq, seq)``: each example's sequence is split over ``seq`` devices
    (:func:`spectral_jax.parallel.split_sequence`) and the batch over the rest. The axes
    are ``Auto`` rather than jax's default ``Explicit``: the models are written in global
    view and leave the partitioning of activations to XLA, so no op needs sharding
    annotations.

    Raises:
        spectral_jax.UsageError: ``seq`` not a positive divisor of the device count.

    Example:
        >>> make_mesh(jax.devices()[:1]).shape["data"]
        1
    """
    devices = list(jax.devices() if devices is None else devices)
    if _checks.positive_int("config", "train.mesh.seq", seq) == 1:
        return jax.make_mesh((len(devices),), (DATA_AXIS,), (AxisType.Auto,), devices=devices)
    if len(devices) % seq:
        raise UsageError(_checks.message(
            "config", "train.mesh.seq", f"a divisor of the device count {len(devices)}", seq))
    return jax.make_mesh((len(devices) // seq, seq), (DATA_AXIS, SEQ_AXIS),
                         (AxisType.Auto, AxisType.Auto), devices=devices)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def check_batch_size(name: str, batch_size: int, mesh: jax.sharding.Mesh) -> None:
    """Raises ValueError unless ``batch_size`` splits evenly over the mesh and the processes.

    Raises:
        TypeError, ValueError: not an int; not a positive multiple of the device count.

    Example:
        >>> check_batch_size("train.batch_size", 8, make_mesh(jax.devices()[:1]))
    """
    n = mesh.shape[DATA_AXIS]
    what = (f"a positive multiple of the device count {n} (data parallelism splits every "
            "batch evenly over the devices of the data axis)")
    if _checks.positive_int("config", name, batch_size) % n:
        raise UsageError(_checks.message("config", name, what, batch_size))


def global_batch(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, Any]:
    """Turns the host's copy of a global batch into global arrays sharded on the batch axis.

    Every process holds the same global batch (the data order is a pure function of seed and
    step) and contributes the rows of its own devices.

    Args:
        batch: numpy arrays whose leading axis is the global batch.
        sharding: the batch sharding of the mesh.

    Returns:
        The same keys as global ``jax.Array`` s.

    Example:
        >>> mesh = make_mesh(jax.devices()[:1])
        >>> global_batch({"x": np.zeros((4, 3))}, batch_sharding(mesh))["x"].shape
        (4, 3)
    """
    count, index = jax.process_count(), jax.process_index()
    out = {}
    for key, value in batch.items():
        rows = value.shape[0] // count
        local = value[index * rows:(index + 1) * rows]
        out[key] = jax.make_array_from_process_local_data(sharding, local, value.shape)
    return out
