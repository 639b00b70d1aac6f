"""Parallelism beyond the batch: one sequence split over devices.

:func:`sequence_parallel` runs any registered attention method on a sequence whose length
axis is split over a mesh axis, with the same outputs and gradients as on one device; what
each method sends is its registry entry's ``sequence_parallel`` form and ``communication``
formula (``spectral_jax.attention.SHARD_FORMS``). Inside :func:`split_sequence` every
attention layer of a Flax model does the same.
"""

from spectral_jax.parallel._sequence import sequence_parallel
from spectral_jax.parallel._split import attention_function, split_sequence

__all__ = ["attention_function", "sequence_parallel", "split_sequence"]
