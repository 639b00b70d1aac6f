"""Token embedding with sinusoidal or learned positions and an optional CLS token (LRA)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax.nn._config import POSITIONALS
from spectral_jax.nn._rngs import stream

Array = jax.Array


def sinusoidal_positions(length: int, features: int) -> np.ndarray:
    """The fixed sinusoidal position table of Vaswani et al. (2017), §3.5.

    Even features are ``sin(p / 10000^(2i/features))``, odd ones the matching ``cos``, as in
    LRA's ``AddPositionEmbs`` (``lra_benchmarks/models/layers/common_layers.py``).

    Args:
        length: number of positions.
        features: embedding width (even or odd).

    Returns:
        float32 numpy array ``(length, features)``.

    Example:
        >>> [round(float(v), 4) for v in sinusoidal_positions(3, 4)[1, :2]]
        [0.8415, 0.5403]
    """
    position = np.arange(length, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, features, 2) * (-np.log(10000.0) / features))
    table = np.zeros((length, features), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div)
    table[:, 1::2] = np.cos(position * div[: features // 2])
    return table.astype(np.float32)


class TokenEmbedding(nnx.Module):
    """Token ids to vectors: embed, optionally prepend a learned CLS vector, add positions.

    Follows LRA's ``transformer.py``: embedding init N(0, 1) (``embed_init_std`` changes it),
    no √d scaling; the CLS vector (init zeros) is prepended before positions are added, so it
    takes position 0; learned positions init N(0, 0.02); dropout after adding positions.

    Args:
        vocab_size: number of token ids.
        features: embedding width.
        max_length: longest token sequence (the CLS token adds one position).
        positional: ``"sinusoidal"`` or ``"learned"`` (added here); ``"rope"`` or ``"none"``
          (nothing added: RoPE acts in the attention layers).
        embed_init_std: standard deviation of the token embedding's normal init.
        cls_token: prepend a learned CLS vector.
        dropout_rate: dropout on the summed embeddings.
        dtype: computation dtype.
        param_dtype: parameter dtype.
        rngs: ``"params"`` and ``"dropout"`` streams.

    Raises:
        spectral_jax.UsageError: unknown ``positional``; a non-positive size.

    A token id outside ``[0, vocab_size)`` has no embedding: a concrete ``inputs`` raises a
    ValueError naming the smallest and largest id and ``vocab_size``; a traced one gives
    NaN vectors at those positions (negative ids too, which ``jnp.take`` would wrap round),
    and under ``jax.experimental.checkify.checkify`` raises the same message, as a mask that
    is not a padding mask does (``spectral_jax.attention``).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> emb = TokenEmbedding(10, 4, 6, cls_token=True, rngs=nnx.Rngs(0))
        >>> emb(jnp.ones((2, 5), jnp.int32), deterministic=True).shape
        (2, 6, 4)
    """

    def __init__(
        self,
        vocab_size: int,
        features: int,
        max_length: int,
        *,
        positional: str = "sinusoidal",
        embed_init_std: float = 1.0,
        cls_token: bool = False,
        dropout_rate: float = 0.0,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("features", features),
                            ("max_length", max_length)):
            _checks.positive_int("TokenEmbedding", name, value)
        _checks.choice("TokenEmbedding", "positional", positional, POSITIONALS)
        _checks.number("TokenEmbedding", "embed_init_std", embed_init_std, low=0.0,
                       low_open=True)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.positional = positional
        self.dtype = dtype
        self.embed = nnx.Embed(
            vocab_size,
            features,
            dtype=dtype,
            param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(embed_init_std),
            rngs=rngs,
        )
        self.cls = (
            nnx.Param(jnp.zeros((1, 1, features), param_dtype)) if cls_token else None
        )
        positions = max_length + int(cls_token)
        self.position_table = (
            nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (positions, features),
                                                    param_dtype))
            if positional == "learned"
            else None
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=stream(rngs, "dropout", "params"))

    def __call__(self, inputs: Array, *, deterministic: bool,
                 positions: Array | None = None) -> Array:
        """Embeds ``inputs``.

        Args:
            inputs: int ``(batch, length)`` token ids, ``length <= max_length``.
            deterministic: no dropout.
            positions: int ``(batch, length)`` positions in ``[0, max_length)`` (packed
              sequences: restarting per segment), no CLS token; None: ``arange(length)``.

        Returns:
            ``(batch, length + cls, features)`` in the computation dtype; the CLS vector, if
            any, at position 0.

        Raises:
            spectral_jax.UsageTypeError: non-integer ``inputs``.
            spectral_jax.UsageError: ``inputs`` not 2-D or longer than ``max_length``; a concrete
              token id outside ``[0, vocab_size)`` (traced: NaN, and a checkify error);
              ``positions`` not int of the inputs' shape, or (concrete) outside
              ``[0, max_length)``.
        """
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise UsageTypeError(f"inputs must be integer token ids, got dtype {inputs.dtype}.")
        if inputs.ndim != 2 or inputs.shape[1] > self.max_length:
            raise UsageError(
                f"inputs must be (batch, length) with length <= max_length={self.max_length}, "
                f"got shape {inputs.shape}."
            )
        x = self.embed(self._checked_ids(inputs))
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)
            x = jnp.concatenate([cls, x], axis=1)
        length = x.shape[1]
        if positions is not None:
            positions = jnp.asarray(positions)
            if (self.cls is not None or positions.shape != inputs.shape
                    or not jnp.issubdtype(positions.dtype, jnp.integer)):
                raise UsageError(f"positions must be int with the shape of inputs {inputs.shape} "
                                 f"(and no CLS token); got {positions.dtype} {positions.shape}.")
            if not isinstance(positions, jax.core.Tracer) and positions.size and not (
                    0 <= int(positions.min()) and int(positions.max()) < self.max_length):
                raise UsageError(f"positions must lie in [0, max_length={self.max_length}); got "
                                 f"{int(positions.min())}..{int(positions.max())}.")
        rows = jnp.arange(length)[None] if positions is None else positions
        if self.positional == "sinusoidal":
            table = jnp.asarray(sinusoidal_positions(self.max_length + (self.cls is not None),
                                                     x.shape[-1]))
            x = x + table[rows].astype(x.dtype)
        elif self.positional == "learned":
            x = x + self.position_table[...][rows].astype(x.dtype)
        return self.dropout(x, deterministic=deterministic)

    def _checked_ids(self, inputs: Array) -> Array:
        """``inputs`` with every id outside ``[0, vocab_size)`` out of the table's range.

        The embedding lookup fills such ids with NaN; a negative id is mapped to
        ``vocab_size`` so that it does not wrap round to a real row.
        """
        vocab = self.vocab_size
        message = (f"TokenEmbedding: token ids in `inputs` must be in [0, vocab_size={vocab}); "
                   "got smallest id {} and largest id {}.")
        if inputs.size == 0:
            return inputs
        if isinstance(inputs, jax.core.Tracer):
            low, high = jnp.min(inputs), jnp.max(inputs)
            _checks.device_check((low >= 0) & (high < vocab), message, low, high)
        else:
            ids = np.asarray(inputs)
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= vocab:
                raise UsageError(message.format(low, high))
        return jnp.where(inputs < 0, vocab, inputs)
