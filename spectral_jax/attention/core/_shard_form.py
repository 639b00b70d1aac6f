"""How a method's sequence is split over devices: the forms named by the registry's
``sequence_parallel`` field.

Each form says what crosses devices when the length axis of query, key and value is split
over a mesh axis (:func:`spectral_jax.parallel.sequence_parallel`). The per-method bytes
are the registry entry's ``communication`` formula; the reductions themselves are the
helpers of :mod:`spectral_jax.attention.core._seq`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

SHARD_FORMS: Mapping[str, str] = MappingProxyType({
    "ring": "exact attention by ring passes: every shard's key and value block visits every "
            "device once (P - 1 ppermute steps), folded in by an online softmax; traffic "
            "grows with n, memory per device falls as 1/P",
    "halo": "each shard receives the window of tokens next to its edges from its neighbours "
            "(ppermute), before and (bidirectional) after",
    "compressed_gather": "each shard compresses the keys and values whose memory slots start "
                         "on it (reading kernel - 1 tokens of the next shard), then every "
                         "shard's slots are all-gathered: n/stride slots, a traffic that "
                         "grows with n",
    "landmark_reductions": "segment sums and counts of the valid tokens (all-reduce), a "
                           "distributed log-sum-exp for the landmark queries' softmax over "
                           "every key; the m x m kernel and its pseudo-inverse replicated",
    "feature_reductions": "the keys' feature summary phi(K)^T V and sum phi(K), an r x (d_v + 1) "
                          "array: all-reduced (bidirectional), or an exclusive prefix of every "
                          "shard's summary (causal, as LASP-2)",
    "summary_reductions": "the l summary rows' softmax over every key (a distributed "
                          "log-sum-exp) and their weighted sum of values, all-reduced; the "
                          "queries read the replicated summary on their own shard",
    "global_selection": "choices made over the whole sequence: k-means sums and counts "
                        "all-reduced, a top-k from every shard's own top-k (all-gather), the "
                        "chosen rows gathered onto every shard and their softmax over every "
                        "key a distributed log-sum-exp",
    "state_prefix": "each shard runs its chunks from a zero state and sums up its effect as an "
                    "affine map of the entering state (a decay, or for the delta rule a d x d "
                    "matrix, and the state it writes); one all-gather of every shard's map and "
                    "a fold over the shards before it give its entering state (LASP-2), then "
                    "its chunks run again from there: traffic independent of n",
})
