"""Flax NNX modules built on :mod:`spectral_jax.attention`.

:class:`MultiHeadAttention` selects any registered attention by name and owns its state
(Nyström conv skip, Performer projection, Linformer projections, Skyformer rng stream).
:class:`TransformerEncoder`, :class:`SequenceClassifier` and :class:`DualEncoderClassifier`
are the Long Range Arena models, configured by a frozen :class:`TransformerConfig`.
"""

from spectral_jax.nn._attention import (
    MultiHeadAttention,
    RandomFeatures,
    init_linformer_projection,
    redraw_features,
)
from spectral_jax.nn._classifier import DualEncoderClassifier, SequenceClassifier, masked_mean
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._embedding import TokenEmbedding, sinusoidal_positions
from spectral_jax.nn._encoder import EncoderBlock, TransformerEncoder

__all__ = [
    "DualEncoderClassifier",
    "EncoderBlock",
    "MultiHeadAttention",
    "RandomFeatures",
    "SequenceClassifier",
    "TokenEmbedding",
    "TransformerConfig",
    "TransformerEncoder",
    "init_linformer_projection",
    "masked_mean",
    "redraw_features",
    "sinusoidal_positions",
]
