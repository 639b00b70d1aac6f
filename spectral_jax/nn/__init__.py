"""Flax NNX modules built on :mod:`spectral_jax.attention`."""

from spectral_jax.nn._config import TransformerConfig

__all__ = ["TransformerConfig"]
