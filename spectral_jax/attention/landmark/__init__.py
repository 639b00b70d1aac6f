"""Landmark (Nyström) approximations and their refinements: Nyström, spectral shifting
("Beyond Nyströmformer"), its symmetric form, and Skyformer's Nyström approximation of the
Gaussian kernel, with the iterative pseudo-inverse they share. The sequence-parallel form of
each is landmark reductions (segment sums, a distributed log-sum-exp). The family builds on
the exact one: when the landmarks cover every key the methods are exact and call it.
"""

from spectral_jax.attention.landmark._nystrom import nystrom_attention
from spectral_jax.attention.landmark._pinv import iterative_pinv
from spectral_jax.attention.landmark._skyformer import skyformer_attention
from spectral_jax.attention.landmark._spectral_shift import (
    spectral_shift_attention,
    spectral_shift_delta,
)
from spectral_jax.attention.landmark._symmetric import symmetric_spectral_shift_attention

__all__ = [
    "iterative_pinv",
    "nystrom_attention",
    "skyformer_attention",
    "spectral_shift_attention",
    "spectral_shift_delta",
    "symmetric_spectral_shift_attention",
]
