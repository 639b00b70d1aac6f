"""The frozen model configuration shared by the NNX and Linen models and the trainer."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Everything that defines an LRA Transformer classifier.

    Frozen and hashable, so equal configs never cause a recompile.

    Attributes:
        vocab_size: number of token ids; id 0 is padding.
        num_classes: number of output classes.
        max_length: longest sequence (per document for dual encoders), in tokens.
        num_layers: encoder blocks.
        embed_dim: model width (features of the residual stream).
        num_heads: attention heads; must divide ``qkv_dim``.
        qkv_dim: total query/key/value features over all heads (head_dim = qkv_dim / num_heads).
        mlp_dim: hidden width of the block MLP and of the classifier head.
        dropout_rate: dropout after embeddings, attention output and MLP.
        attention_dropout_rate: dropout on attention weights (exact softmax only).
        attention: registry name, see ``spectral_jax.attention.available_attentions()``.
        attention_kwargs: method parameters as a tuple of (name, value) pairs (hashable), e.g.
          ``(("num_landmarks", 64),)``.
        pooling: ``"cls"`` (prepend a learned CLS token, take its output) or ``"mean"`` (mean
          over valid tokens only).
        positional: ``"sinusoidal"`` (fixed) or ``"learned"``.
        use_bias: biases on the query/key/value/output projections (LRA's JAX code: False;
          the Nyströmformer/Skyformer PyTorch code: True).
        interaction: dual encoder only: ``"concat"`` ([u, v]) or ``"nli"`` ([u, v, u*v, u-v]).
        is_causal: causal self-attention in every block (required by causal-only methods
          such as ``gated_linear``; use ``pooling="mean"``: a CLS token at position 0
          would see only itself).
        dtype: computation dtype (e.g. bfloat16); logits' log-softmax stays float32.
        param_dtype: parameter dtype.
    """

    vocab_size: int
    num_classes: int
    max_length: int
    num_layers: int = 2
    embed_dim: int = 64
    num_heads: int = 2
    qkv_dim: int = 64
    mlp_dim: int = 128
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    attention: str = "softmax"
    attention_kwargs: tuple[tuple[str, Any], ...] = ()
    pooling: Literal["cls", "mean"] = "mean"
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    interaction: Literal["concat", "nli"] = "concat"
    use_bias: bool = True
    is_causal: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @property
    def attention_kwargs_dict(self) -> dict[str, Any]:
        return dict(self.attention_kwargs)
