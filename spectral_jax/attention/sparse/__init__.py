"""Sparse and clustered attention: local (a band of window tokens, with its ring-buffer decode
form and the halo exchange of a split sequence), clustered and improved clustered attention
(k-means over queries) and ProbSparse (the queries of largest sparsity measure), whose
choices are made over the whole sequence, also when it is split over devices.
"""

from spectral_jax.attention.sparse._clustered import (
    clustered_attention,
    improved_clustered_attention,
)
from spectral_jax.attention.sparse._local import local_attention
from spectral_jax.attention.sparse._probsparse import probsparse_attention

__all__ = [
    "clustered_attention",
    "improved_clustered_attention",
    "local_attention",
    "probsparse_attention",
]
