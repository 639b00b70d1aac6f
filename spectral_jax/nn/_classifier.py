"""LRA classifiers: one encoder + pooling + MLP head, and the shared-encoder dual classifier."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._encoder import TransformerEncoder
from spectral_jax.nn._state import uses_rng

Array = jax.Array


def masked_mean(x: Array, mask: Array) -> Array:
    """Mean of ``x`` over the valid positions of each sequence.

    Padded positions contribute nothing and are not counted; a sequence with no valid
    position gives zeros, not NaN. Accumulates in float32 (or wider).

    Args:
        x: float ``(batch, length, features)``.
        mask: bool ``(batch, length)``, True = valid.

    Returns:
        ``(batch, features)`` in float32 (float64 for float64 ``x``).

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
        >>> masked_mean(x, jnp.array([[True, True, False]])).tolist()
        [[2.0, 3.0]]
    """
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    weights = mask.astype(dtype)[..., None]
    total = jnp.sum(x.astype(dtype) * weights, axis=-2)
    count = jnp.sum(weights, axis=-2)
    return total / jnp.maximum(count, 1.0)


def last_valid(x: Array, mask: Array) -> Array:
    """``x`` at the last valid position of each sequence: in a causal model, the one token
    that has read the whole sequence.

    A sequence with no valid position gives zeros. Any padding side works (the last True of
    ``mask``, wherever the padding is). Arguments, shapes and result dtype as
    :func:`masked_mean`.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
        >>> last_valid(x, jnp.array([[True, True, False]])).tolist()
        [[3.0, 4.0]]
    """
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    index = jnp.max(jnp.where(mask, jnp.arange(mask.shape[-1]), -1), axis=-1)
    picked = jnp.take_along_axis(x, jnp.maximum(index, 0)[:, None, None], axis=-2)[:, 0]
    return jnp.where((index >= 0)[:, None], picked.astype(dtype), 0.0)


def _check_config(config: TransformerConfig) -> None:
    if not isinstance(config, TransformerConfig):
        raise UsageTypeError(f"config must be a TransformerConfig, got {type(config).__name__}.")
    # Its choices (pooling, interaction, ...) were checked when it was constructed.


# The token id that pads sequences (the LRA readers' and tokenizers' convention).
PAD_ID = 0


def _call_defaults(config: TransformerConfig, inputs: Array, mask: Array | None,
                   deterministic: bool | None) -> tuple[Array, bool]:
    """The mask (tokens other than :data:`PAD_ID`) and ``deterministic`` when not given.

    As Flax's attention modules, ``deterministic`` is needed only when the model is random
    (dropout or a random attention state); otherwise both modes are the same computation.
    """
    if mask is None:
        mask = jnp.asarray(inputs) != PAD_ID
    if deterministic is None:
        if config.dropout_rate > 0.0 or uses_rng(config.attention,
                                                  config.attention_dropout_rate):
            raise UsageError(
                f"deterministic must be given: the model is random in training (dropout_rate="
                f"{config.dropout_rate}, attention={config.attention!r}); pass "
                "deterministic=False to train, True to evaluate."
            )
        deterministic = True
    return mask, deterministic


def _pool(config: TransformerConfig, x: Array, mask: Array) -> Array:
    """(batch, length[+1], features) encoder output to float32 (batch, features)."""
    if config.pooling == "cls":
        return x[:, 0].astype(jnp.promote_types(x.dtype, jnp.float32))
    if config.pooling == "last":
        return last_valid(x, mask)
    return masked_mean(x, mask)


class SequenceClassifier(nnx.Module):
    """LRA single-sequence classifier: encoder, CLS, MEAN or LAST pooling, Dense → ReLU → Dense.

    With ``pooling="cls"`` a learned CLS token is prepended and its output is pooled; with
    ``"mean"`` the output is averaged over valid tokens only (Tay et al. 2021, LRA,
    ``lra_benchmarks/models/layers/common_layers.py::classifier_head``; LRA's MEAN also
    counts padding, we do not); with ``"last"`` the last valid token's output is taken, the
    read-out of a causal model (:func:`last_valid`). The head runs in float32 so the logits
    and their log-softmax are float32 under any ``config.dtype``.

    Args:
        config: the model configuration.
        rngs: ``"params"``, ``"dropout"``, and optionally ``"landmarks"`` (Skyformer) and
          ``"features"`` (Performer).

    Raises:
        spectral_jax.UsageTypeError: ``config`` is not a :class:`TransformerConfig`.
        spectral_jax.UsageError: unknown pooling, positional or attention name; bad attention
          options.
        spectral_jax.UnsupportedError: see :class:`MultiHeadAttention`.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import SequenceClassifier, TransformerConfig
        >>> config = TransformerConfig(vocab_size=10, num_classes=3, max_length=8)
        >>> model = SequenceClassifier(config, rngs=nnx.Rngs(0))
        >>> tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0]])
        >>> model(tokens, tokens > 0, deterministic=True).shape
        (1, 3)
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        _check_config(config)
        self.config = config
        self.encoder = TransformerEncoder(config, cls_token=config.pooling == "cls", rngs=rngs)
        head = dict(dtype=jnp.float32, param_dtype=config.param_dtype, rngs=rngs)
        self.hidden = nnx.Linear(config.embed_dim, config.mlp_dim, **head)
        self.logits = nnx.Linear(config.mlp_dim, config.num_classes, **head)

    def embed(self, inputs: Array, mask: Array, *, deterministic: bool) -> Array:
        """The pooled sequence embedding, float32 ``(batch, embed_dim)``.

        Args and errors as for ``__call__``.
        """
        x = self.encoder(inputs, mask, deterministic=deterministic)
        return _pool(self.config, x, mask)

    def __call__(self, inputs: Array, mask: Array | None = None, *,
                 deterministic: bool | None = None) -> Array:
        """Classifies token sequences.

        Args:
            inputs: int ``(batch, length)``, ``length <= config.max_length``.
            mask: bool ``(batch, length)``, True for real tokens; None: the tokens that are
              not the padding id 0.
            deterministic: no dropout, fixed Skyformer landmarks (evaluation); may be left
              out when the model has nothing random (no dropout, no random attention state).

        Returns:
            float32 logits ``(batch, num_classes)``.

        Raises:
            spectral_jax.UsageTypeError: non-integer ``inputs`` or non-bool ``mask``.
            spectral_jax.UsageError: mismatched shapes or ``length > config.max_length``;
              ``deterministic`` left out for a random model.
        """
        mask, deterministic = _call_defaults(self.config, inputs, mask, deterministic)
        pooled = self.embed(inputs, mask, deterministic=deterministic)
        return self.logits(nnx.relu(self.hidden(pooled)))


class DualEncoderClassifier(nnx.Module):
    """LRA Retrieval classifier: one shared encoder per document, then an MLP on the pair.

    Both documents go through the same encoder as separate batch rows, so they never attend
    to each other and a document's embedding does not depend on its partner. Interaction
    ``"concat"`` gives ``[u, v]`` (LRA default), ``"nli"`` gives ``[u, v, u*v, u-v]``
    (Nyströmformer/Skyformer LRA code). Head: Dense(mlp_dim) → ReLU → Dense(mlp_dim // 2) →
    ReLU → Dense(num_classes) (LRA ``classifier_head_dual``), in float32. Unlike LRA, CLS
    pooling prepends a real CLS token to each document.

    Args:
        config: the model configuration (``max_length`` is per document).
        rngs: as for :class:`SequenceClassifier`.

    Raises:
        As :class:`SequenceClassifier`, and ValueError for an unknown ``interaction``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import DualEncoderClassifier, TransformerConfig
        >>> config = TransformerConfig(vocab_size=10, num_classes=2, max_length=4)
        >>> model = DualEncoderClassifier(config, rngs=nnx.Rngs(0))
        >>> tokens = jnp.array([[[3, 4, 0, 0], [5, 6, 7, 0]]])
        >>> model(tokens, tokens > 0, deterministic=True).shape
        (1, 2)
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        _check_config(config)
        self.config = config
        self.encoder = TransformerEncoder(config, cls_token=config.pooling == "cls", rngs=rngs)
        pair = (2 if config.interaction == "concat" else 4) * config.embed_dim
        head = dict(dtype=jnp.float32, param_dtype=config.param_dtype, rngs=rngs)
        self.hidden = nnx.Linear(pair, config.mlp_dim, **head)
        self.hidden2 = nnx.Linear(config.mlp_dim, config.mlp_dim // 2, **head)
        self.logits = nnx.Linear(config.mlp_dim // 2, config.num_classes, **head)

    def embed(self, inputs: Array, mask: Array, *, deterministic: bool) -> tuple[Array, Array]:
        """The pooled embeddings ``(u, v)`` of both documents, each float32 ``(batch, embed_dim)``.

        Args and errors as for ``__call__``.
        """
        if inputs.ndim != 3 or inputs.shape[1] != 2:
            raise UsageError(f"inputs must be (batch, 2, length), got shape {inputs.shape}.")
        if mask.shape != inputs.shape:
            raise UsageError(
                f"mask must have the shape of inputs {inputs.shape}, got {mask.shape}."
            )
        batch, _, length = inputs.shape
        # Documents become separate rows of one batch: one encoder pass, no cross-attention.
        flat_mask = mask.reshape(2 * batch, length)
        x = self.encoder(inputs.reshape(2 * batch, length), flat_mask, deterministic=deterministic)
        pooled = _pool(self.config, x, flat_mask).reshape(batch, 2, -1)
        return pooled[:, 0], pooled[:, 1]

    def __call__(self, inputs: Array, mask: Array | None = None, *,
                 deterministic: bool | None = None) -> Array:
        """Classifies document pairs.

        Args:
            inputs: int ``(batch, 2, length)``, ``length <= config.max_length``.
            mask: bool ``(batch, 2, length)``, True for real tokens; None: the tokens that
              are not the padding id 0.
            deterministic: as for :class:`SequenceClassifier`.

        Returns:
            float32 logits ``(batch, num_classes)``.

        Raises:
            spectral_jax.UsageTypeError: non-integer ``inputs`` or non-bool ``mask``.
            spectral_jax.UsageError: shapes other than ``(batch, 2, length)``;
              ``length > max_length``; ``deterministic`` left out for a random model.
        """
        mask, deterministic = _call_defaults(self.config, inputs, mask, deterministic)
        u, v = self.embed(inputs, mask, deterministic=deterministic)
        if self.config.interaction == "concat":
            pair = jnp.concatenate([u, v], axis=-1)
        else:
            pair = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        x = nnx.relu(self.hidden2(nnx.relu(self.hidden(pair))))
        return self.logits(x)
