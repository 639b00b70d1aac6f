"""The LRA Transformer encoder: embeddings, pre-LayerNorm blocks, final LayerNorm."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax.nn._attention import (
    DEFAULT_PROJ_LEN,
    MultiHeadAttention,
    init_linformer_projection,
)
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._embedding import TokenEmbedding
from spectral_jax.nn._rngs import stream

Array = jax.Array


class EncoderBlock(nnx.Module):
    """One pre-LayerNorm Transformer block (LRA ``TransformerBlock``).

    ``x = x + Dropout(Attention(LN(x)))``, then ``x = x + Dropout(Dense(GELU-Dropout(Dense(
    LN(x)))))``: the MLP is Dense(mlp_dim) → GELU → Dropout → Dense(embed_dim) → Dropout
    (``lra_benchmarks/models/transformer/transformer.py``).

    Args:
        config: the model configuration.
        attention_kwargs: the attention options for this block (the encoder fills in
          Linformer's ``max_length``).
        rngs: ``"params"``, ``"dropout"`` and the attention's streams.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import TransformerConfig
        >>> config = TransformerConfig(vocab_size=10, num_classes=2, max_length=8)
        >>> block = EncoderBlock(config, {}, rngs=nnx.Rngs(0))
        >>> block(jnp.ones((1, 8, 64)), None, deterministic=True).shape
        (1, 8, 64)
    """

    def __init__(
        self, config: TransformerConfig, attention_kwargs: dict[str, Any], *, rngs: nnx.Rngs
    ) -> None:
        c = config
        common = dict(dtype=c.dtype, param_dtype=c.param_dtype, rngs=rngs)
        self.attention_norm = nnx.LayerNorm(c.embed_dim, **common)
        self.attention = MultiHeadAttention(
            c.num_heads,
            c.embed_dim,
            attention=c.attention,
            attention_kwargs=attention_kwargs,
            qkv_features=c.qkv_dim,
            out_features=c.embed_dim,
            dropout_rate=c.attention_dropout_rate,
            use_bias=c.use_bias,
            **common,
        )
        self.mlp_norm = nnx.LayerNorm(c.embed_dim, **common)
        self.mlp_in = nnx.Linear(c.embed_dim, c.mlp_dim, **common)
        self.mlp_out = nnx.Linear(c.mlp_dim, c.embed_dim, **common)
        self.dropout = nnx.Dropout(c.dropout_rate, rngs=stream(rngs, "dropout", "params"))

    def __call__(
        self,
        x: Array,
        mask: Array | None,
        *,
        deterministic: bool,
        linformer_projection: Array | None = None,
    ) -> Array:
        """Applies the block.

        Args:
            x: ``(batch, length, embed_dim)``.
            mask: bool ``(batch, 1, length, length)`` padding mask, or None.
            deterministic: no dropout, fixed Skyformer landmarks.
            linformer_projection: the encoder's shared Linformer projection, if any.

        Returns:
            ``(batch, length, embed_dim)``.
        """
        y = self.attention(
            self.attention_norm(x),
            mask=mask,
            deterministic=deterministic,
            linformer_projection=linformer_projection,
        )
        x = x + self.dropout(y, deterministic=deterministic)
        y = nnx.gelu(self.mlp_in(self.mlp_norm(x)), approximate=False)
        y = self.mlp_out(self.dropout(y, deterministic=deterministic))
        return x + self.dropout(y, deterministic=deterministic)


class TransformerEncoder(nnx.Module):
    """Token ids to contextual vectors: the LRA encoder with any registered attention.

    Embedding (sinusoidal or learned positions, optional CLS token at position 0), then
    ``num_layers`` pre-LayerNorm :class:`EncoderBlock` s and a final LayerNorm (Tay et al.
    2021, LRA, ``lra_benchmarks/models/transformer/transformer.py``). With Linformer's
    ``sharing="layerwise"`` the encoder owns the one projection all layers use; with
    ``max_length`` absent from ``attention_kwargs`` Linformer gets the encoder's length.

    Args:
        config: the model configuration.
        cls_token: prepend a learned CLS vector (the output then has ``length + 1`` positions).
        rngs: ``"params"``, ``"dropout"``, and optionally ``"landmarks"`` (Skyformer) and
          ``"features"`` (Performer).

    Raises:
        ValueError/NotImplementedError: bad configuration (see :class:`MultiHeadAttention`).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import TransformerConfig, TransformerEncoder
        >>> config = TransformerConfig(vocab_size=10, num_classes=2, max_length=8)
        >>> encoder = TransformerEncoder(config, rngs=nnx.Rngs(0))
        >>> tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0]])
        >>> encoder(tokens, tokens > 0, deterministic=True).shape
        (1, 8, 64)
    """

    def __init__(
        self, config: TransformerConfig, *, cls_token: bool = False, rngs: nnx.Rngs
    ) -> None:
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}.")
        self.config = config
        self.cls_token = cls_token
        self.embedding = TokenEmbedding(
            config.vocab_size,
            config.embed_dim,
            config.max_length,
            positional=config.positional,
            cls_token=cls_token,
            dropout_rate=config.dropout_rate,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            rngs=rngs,
        )
        attention_kwargs = config.attention_kwargs_dict
        if config.attention == "linformer":
            attention_kwargs.setdefault("max_length", config.max_length + int(cls_token))
        # The blocks validate the attention options before the shared projection uses them.
        self.layers = nnx.List(
            [EncoderBlock(config, attention_kwargs, rngs=rngs) for _ in range(config.num_layers)]
        )
        self.shared_projection = nnx.data(None)
        if config.attention == "linformer" and attention_kwargs.get("sharing") == "layerwise":
            self.shared_projection = init_linformer_projection(
                attention_kwargs.get("proj_len", DEFAULT_PROJ_LEN),
                attention_kwargs["max_length"],
                param_dtype=config.param_dtype,
                rngs=rngs,
            )
        self.norm = nnx.LayerNorm(
            config.embed_dim, dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs
        )

    def __call__(self, inputs: Array, mask: Array, *, deterministic: bool) -> Array:
        """Encodes token ids.

        Args:
            inputs: int ``(batch, length)``, ``length <= config.max_length``.
            mask: bool ``(batch, length)``, True for real tokens (padding is ignored: outputs
              at valid positions do not depend on the content of padded ones).
            deterministic: no dropout, fixed Skyformer landmarks.

        Returns:
            ``(batch, length + cls_token, embed_dim)`` in ``config.dtype``; the CLS output,
            if any, at position 0.

        Raises:
            TypeError: non-integer ``inputs`` or non-bool ``mask``.
            ValueError: ``mask`` shape differs from ``inputs``; ``length > max_length``.
        """
        if mask.dtype != jnp.bool_:
            raise TypeError(f"mask must be bool (True = token), got dtype {mask.dtype}.")
        if mask.shape != inputs.shape:
            raise ValueError(
                f"mask must have the shape of inputs {inputs.shape}, got {mask.shape}."
            )
        x = self.embedding(inputs, deterministic=deterministic)
        if self.cls_token:
            mask = jnp.concatenate([jnp.ones_like(mask[:, :1]), mask], axis=1)
        pairwise = mask[:, None, :, None] & mask[:, None, None, :]
        shared = None if self.shared_projection is None else self.shared_projection[...]
        for layer in self.layers:
            x = layer(x, pairwise, deterministic=deterministic, linformer_projection=shared)
        return self.norm(x)
