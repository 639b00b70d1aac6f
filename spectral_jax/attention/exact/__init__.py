"""Exact attention: softmax (with its float64 reference) and the Gaussian-kernel attention
that Skyformer approximates, with every form: the parallel and causal calls, the key/value
cache, and ring attention on a split sequence.
"""

from spectral_jax.attention.exact._kernelized import kernelized_attention
from spectral_jax.attention.exact._softmax import reference_attention, softmax_attention

__all__ = [
    "kernelized_attention",
    "reference_attention",
    "softmax_attention",
]
