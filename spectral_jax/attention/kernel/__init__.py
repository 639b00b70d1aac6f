"""Kernel feature maps: linear attention (elu + 1 and its kin), Performer's random features
and gated linear attention, with their running feature-sum decode states and the
feature reductions (all-reduce, or an exclusive prefix when causal) on a split sequence.
"""

from spectral_jax.attention.kernel._gated_linear import gated_linear_attention
from spectral_jax.attention.kernel._linear import linear_attention
from spectral_jax.attention.kernel._performer import orthogonal_random_features, performer_attention

__all__ = [
    "gated_linear_attention",
    "linear_attention",
    "orthogonal_random_features",
    "performer_attention",
]
