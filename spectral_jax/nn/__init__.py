"""Flax NNX modules built on :mod:`spectral_jax.attention`.

:class:`MultiHeadAttention` selects any registered attention by name and owns its state
through one small module per kind of state (random features, length projections, a landmark
rng stream, inducing points, Luna's packed sequence, RFA-Gate's gates) and the optional
Nyström conv skip, and rotates queries and keys with :func:`apply_rope` when asked (RoPE).
:class:`TransformerEncoder`, :class:`SequenceClassifier` and :class:`DualEncoderClassifier`
are the Long Range Arena models, configured by a frozen :class:`TransformerConfig`;
:class:`CausalLM` is a decoder-only language model on the same blocks, and :func:`generate`
continues a prompt with its decoding cache.
:func:`allowed_attention_kwargs` and :func:`module_options` say which ``attention_kwargs`` a
method takes; :func:`normalise_attention_kwargs` gives their one stored (hashable) form.
"""

from spectral_jax.nn._attention import MultiHeadAttention
from spectral_jax.nn._attention_kwargs import (
    allowed_attention_kwargs,
    module_options,
    normalise_attention_kwargs,
)
from spectral_jax.nn._causal_lm import CausalLM, generate
from spectral_jax.nn._classifier import (
    DualEncoderClassifier,
    SequenceClassifier,
    last_valid,
    masked_mean,
)
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._embedding import TokenEmbedding, sinusoidal_positions
from spectral_jax.nn._encoder import EncoderBlock, TransformerEncoder
from spectral_jax.nn._learned_state import (
    GateState,
    InducingPointState,
    PackedSequenceState,
)
from spectral_jax.nn._memory_conv import MemoryConvState
from spectral_jax.nn._rope import apply_rope, rotary_embedding
from spectral_jax.nn._state import (
    STATE_MODULES,
    ConvSkip,
    LandmarkRngState,
    LengthProjectionState,
    RandomFeatures,
    RandomFeatureState,
    init_linformer_projection,
    redraw_features,
    uses_rng,
)
from spectral_jax.nn._symmetric import PairwiseScores

__all__ = [
    "STATE_MODULES",
    "CausalLM",
    "ConvSkip",
    "DualEncoderClassifier",
    "EncoderBlock",
    "GateState",
    "InducingPointState",
    "LandmarkRngState",
    "LengthProjectionState",
    "MemoryConvState",
    "MultiHeadAttention",
    "PackedSequenceState",
    "PairwiseScores",
    "RandomFeatureState",
    "RandomFeatures",
    "SequenceClassifier",
    "TokenEmbedding",
    "TransformerConfig",
    "TransformerEncoder",
    "allowed_attention_kwargs",
    "apply_rope",
    "generate",
    "init_linformer_projection",
    "last_valid",
    "masked_mean",
    "module_options",
    "normalise_attention_kwargs",
    "redraw_features",
    "rotary_embedding",
    "sinusoidal_positions",
    "uses_rng",
]
