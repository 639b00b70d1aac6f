"""The LRA Transformer encoder: embeddings, pre-LayerNorm blocks, final LayerNorm."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError, UsageTypeError
from spectral_jax import attention as _attention
from spectral_jax.nn._attention import MultiHeadAttention
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._embedding import TokenEmbedding
from spectral_jax.nn._rngs import stream
from spectral_jax.nn._state import STATE_MODULES

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
        shared_state: the encoder's attention state shared by every block, or None.
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
        self,
        config: TransformerConfig,
        attention_kwargs: dict[str, Any],
        *,
        shared_state: nnx.Module | None = None,
        rngs: nnx.Rngs,
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
            is_causal=c.is_causal,
            rope=c.positional == "rope",
            shared_state=shared_state,
            **common,
        )
        self.mlp_norm = nnx.LayerNorm(c.embed_dim, **common)
        self.mlp_in = nnx.Linear(c.embed_dim, c.mlp_dim, **common)
        self.mlp_out = nnx.Linear(c.mlp_dim, c.embed_dim, **common)
        self.dropout = nnx.Dropout(c.dropout_rate, rngs=stream(rngs, "dropout", "params"))

    def __call__(self, x: Array, mask: Array | None, *, deterministic: bool,
                 carry: Array | None = None, return_carry: bool = False,
                 decode: bool | None = None, segment_ids: Array | None = None,
                 positions: Array | None = None) -> Array | tuple[Array, Array | None]:
        """Applies the block.

        Args:
            x: ``(batch, length, embed_dim)``.
            mask: bool ``(batch, 1, length, length)`` padding mask, or None.
            deterministic: no dropout, fixed Skyformer landmarks.
            carry: the previous block's carried attention state (Luna's P), or None.
            return_carry: also return the carry for the next block (see
              :class:`MultiHeadAttention`).
            decode: decode the next token(s) from the attention's cache (its ``init_cache``;
              ``mask`` must be None); None: the attention's own ``decode``.
            segment_ids, positions: packed sequences (see :class:`MultiHeadAttention`);
              ``positions`` reach the attention only where it rotates (``rope``).

        Returns:
            ``(batch, length, embed_dim)``; with ``return_carry``, ``(x, next_carry)``.
        """
        y, carry = self.attention(self.attention_norm(x), mask=mask,
                                  deterministic=deterministic, carry=carry, return_carry=True,
                                  decode=decode, segment_ids=segment_ids,
                                  positions=positions if self.attention.rope else None)
        x = x + self.dropout(y, deterministic=deterministic)
        y = nnx.gelu(self.mlp_in(self.mlp_norm(x)), approximate=False)
        y = self.mlp_out(self.dropout(y, deterministic=deterministic))
        x = x + self.dropout(y, deterministic=deterministic)
        return (x, carry) if return_carry else x


class TransformerEncoder(nnx.Module):
    """Token ids to contextual vectors: the LRA encoder with any registered attention.

    Embedding (sinusoidal or learned positions, optional CLS token at position 0), then
    ``num_layers`` pre-LayerNorm :class:`EncoderBlock` s and a final LayerNorm (Tay et al.
    2021, LRA, ``lra_benchmarks/models/transformer/transformer.py``). A state every layer
    shares (Linformer's ``sharing="layerwise"``) is built once here and passed to each
    block; a state with a ``max_length`` option gets the encoder's length when it is absent
    from ``attention_kwargs``. A method whose registry entry has a ``carry`` (Luna) hands it
    from block to block: the first block uses its own learned P, each block returns the next
    P (``EncoderBlock(..., return_carry=True)``).

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
            raise UsageTypeError(
                f"config must be a TransformerConfig, got {type(config).__name__}.")
        self.config = config
        self.cls_token = cls_token
        self.embedding = TokenEmbedding(
            config.vocab_size,
            config.embed_dim,
            config.max_length,
            positional=config.positional,
            embed_init_std=config.embed_init_std,
            cls_token=cls_token,
            dropout_rate=config.dropout_rate,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            rngs=rngs,
        )
        attention_kwargs = config.attention_kwargs_dict
        kind = _attention.get_attention_spec(config.attention).state_kind
        if kind is not None and "max_length" in kind.options:
            attention_kwargs.setdefault("max_length", config.max_length + int(cls_token))
        shared_state = None
        shared = getattr(STATE_MODULES.get(kind.name), "shared", None) if kind else None
        if shared is not None:
            shared_state = shared(attention_kwargs, param_dtype=config.param_dtype, rngs=rngs)
        self.layers = nnx.List([
            EncoderBlock(config, attention_kwargs, shared_state=shared_state, rngs=rngs)
            for _ in range(config.num_layers)
        ])
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
            spectral_jax.UsageTypeError: non-integer ``inputs`` or non-bool ``mask``.
            spectral_jax.UsageError: ``mask`` shape differs from ``inputs``;
              ``length > max_length``.
        """
        if mask.dtype != jnp.bool_:
            raise UsageTypeError(f"mask must be bool (True = token), got dtype {mask.dtype}.")
        if mask.shape != inputs.shape:
            raise UsageError(
                f"mask must have the shape of inputs {inputs.shape}, got {mask.shape}."
            )
        x = self.embedding(inputs, deterministic=deterministic)
        if self.cls_token:
            mask = jnp.concatenate([jnp.ones_like(mask[:, :1]), mask], axis=1)
        pairwise = mask[:, None, :, None] & mask[:, None, None, :]
        carry = None
        for layer in self.layers:
            x, carry = layer(x, pairwise, deterministic=deterministic, carry=carry,
                             return_carry=True)
        return self.norm(x)
