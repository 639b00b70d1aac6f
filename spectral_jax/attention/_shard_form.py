"""How a method's sequence is split over devices: the forms named by the registry's
``sequence_parallel`` field.

Each form says what crosses devices when the length axis of query, key and value is split
over a mesh axis (:func:`spectral_jax.parallel.sequence_parallel`). The per-method bytes
are the registry entry's ``communication`` formula; the reductions themselves are the
helpers of :mod:`spectral_jax.attention._seq`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

SHARD_FORMS: Mapping[str, str] = MappingProxyType({
    "landmark_reductions": "segment sums and counts of the valid tokens (all-reduce), a "
                           "distributed log-sum-exp for the landmark queries' softmax over "
                           "every key; the m x m kernel and its pseudo-inverse replicated",
})
