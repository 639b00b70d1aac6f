"""Parallelism beyond the batch: one sequence split over devices.

:func:`sequence_parallel` runs any registered attention method on a sequence whose length
axis is split over a mesh axis, with the same outputs and gradients as on one device; what
each method sends is its registry entry's ``sequence_parallel`` form and ``communication``
formula (``spectral_jax.attention.SHARD_FORMS``).
"""

from spectral_jax.parallel._sequence import sequence_parallel

__all__ = ["sequence_parallel"]
