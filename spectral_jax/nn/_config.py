"""The frozen model configuration shared by the NNX and Linen models and the trainer.

:class:`TransformerConfig` is the one schema of the LRA model: its fields and defaults are also
the ``model`` section of the LRA harness's training configs, and the choices and ranges below
are checked once, here, for every caller (:meth:`TransformerConfig.check_fields`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from spectral_jax import _checks
from spectral_jax.nn._attention_kwargs import normalise_attention_kwargs
from spectral_jax.nn._rope import check_head_dim

POOLINGS = ("cls", "mean", "last")
POSITIONALS = ("sinusoidal", "learned", "rope", "none")
INTERACTIONS = ("concat", "nli")

_CHOICES = {"pooling": POOLINGS, "positional": POSITIONALS, "interaction": INTERACTIONS}
_POSITIVE_INTS = ("vocab_size", "num_classes", "max_length", "num_layers", "embed_dim",
                  "num_heads", "qkv_dim", "mlp_dim")
_RATES = ("dropout_rate", "attention_dropout_rate")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Everything that defines an LRA Transformer classifier.

    Frozen and hashable, so equal configs never cause a recompile. Checked on construction.

    Attributes:
        vocab_size: number of token ids; id 0 is padding.
        num_classes: number of output classes.
        max_length: longest sequence (per document for dual encoders), in tokens.
        num_layers: encoder blocks.
        embed_dim: model width (features of the residual stream).
        num_heads: attention heads; must divide ``qkv_dim``.
        qkv_dim: total query/key/value features over all heads (head_dim = qkv_dim / num_heads).
        mlp_dim: hidden width of the block MLP and of the classifier head.
        dropout_rate: dropout after embeddings, attention output and MLP, in [0, 1).
        attention_dropout_rate: dropout on attention weights (exact softmax only), in [0, 1).
        attention: registry name, see ``spectral_jax.attention.available_attentions()``.
        attention_kwargs: method parameters and module options, a mapping such as
          ``{"num_landmarks": 64}`` (``(name, value)`` pairs are accepted too). Stored as
          ``(name, value)`` pairs sorted by name, so the config stays hashable and equal
          contents give equal configs; :attr:`attention_kwargs_dict` gives the mapping.
        pooling: ``"cls"`` (prepend a learned CLS token, take its output), ``"mean"`` (mean
          over valid tokens only) or ``"last"`` (the last valid token's output: with
          ``is_causal`` the one that has read the whole sequence); :data:`POOLINGS`.
        positional: ``"sinusoidal"`` (fixed) or ``"learned"``, both added to the token
          embeddings; ``"rope"``: nothing added, queries and keys of every attention layer
          rotated by their positions (RoFormer, :func:`spectral_jax.nn.apply_rope`); ``"none"``:
          no positions at all; :data:`POSITIONALS`.
        embed_init_std: standard deviation of the token embedding's normal init (LRA's JAX
          code: 1.0; the Nyströmformer/Skyformer PyTorch code: 0.02, the same as its learned
          positions, which LRA also draws with 0.02). It sets how loud positions are next to
          tokens: at 1.0 a learned position is 1/50 of its token's vector.
        interaction: dual encoder only: ``"concat"`` ([u, v]) or ``"nli"`` ([u, v, u*v, u-v]);
          :data:`INTERACTIONS`.
        use_bias: biases on the query/key/value/output projections (LRA's JAX code: False;
          the Nyströmformer/Skyformer PyTorch code: True).
        is_causal: causal self-attention in every block (required by causal-only methods
          such as ``gated_linear``; use ``pooling="mean"``: a CLS token at position 0
          would see only itself).
        dtype: computation dtype (e.g. bfloat16); logits' log-softmax stays float32.
        param_dtype: parameter dtype.

    Raises:
        spectral_jax.UsageError: an unknown ``pooling``, ``positional`` or ``interaction``; a
          size below 1; a dropout rate outside [0, 1); ``positional="rope"`` with an odd head
          dimension ``qkv_dim / num_heads``.
        spectral_jax.UsageTypeError: a value of the wrong kind, e.g. a string size or
          ``attention_kwargs`` that is not a mapping.
        The attention name and its arguments are checked by
        :class:`spectral_jax.nn.MultiHeadAttention`.

    Example:
        >>> cfg = TransformerConfig(vocab_size=10, num_classes=2, max_length=8, pooling="cls")
        >>> cfg.num_layers, cfg.attention
        (2, 'softmax')
        >>> TransformerConfig(vocab_size=10, num_classes=2, max_length=8, attention="nystrom",
        ...                   attention_kwargs={"num_landmarks": 4}).attention_kwargs
        (('num_landmarks', 4),)
        >>> TransformerConfig(vocab_size=10, num_classes=2, max_length=8, pooling="max")
        Traceback (most recent call last):
        ...
        spectral_jax.UsageError: TransformerConfig: `pooling` must be one of ('cls', ...
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
    attention_kwargs: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    pooling: Literal["cls", "mean", "last"] = "mean"
    positional: Literal["sinusoidal", "learned", "rope", "none"] = "sinusoidal"
    embed_init_std: float = 1.0
    interaction: Literal["concat", "nli"] = "concat"
    use_bias: bool = True
    is_causal: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        # The one stored form of attention_kwargs (frozen: set through object.__setattr__).
        object.__setattr__(self, "attention_kwargs", normalise_attention_kwargs(
            "TransformerConfig", self.attention_kwargs))
        self.check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @property
    def attention_kwargs_dict(self) -> dict[str, Any]:
        """``attention_kwargs`` as a new dict (name to value)."""
        return dict(self.attention_kwargs)

    @staticmethod
    def check_fields(values: Mapping[str, Any], *, owner: str = "TransformerConfig",
                     prefix: str = "") -> None:
        """Checks the :class:`TransformerConfig` fields present in ``values``.

        The trainer checks a config file's ``model`` section with it before any data is
        loaded (``owner="config", prefix="model."``); None stands for a size the data will
        give.

        Raises:
            spectral_jax.UsageError, spectral_jax.UsageTypeError: as the constructor, naming
              ``prefix + field``.

        Example:
            >>> TransformerConfig.check_fields({"positional": "rotary"}, owner="config",
            ...                                prefix="model.")
            Traceback (most recent call last):
            ...
            spectral_jax.UsageError: config: `model.positional` must be one of ('sinusoidal', ...
        """
        for name, allowed in _CHOICES.items():
            if name in values:
                _checks.choice(owner, prefix + name, values[name], allowed)
        for name in _POSITIVE_INTS:
            if values.get(name) is not None:
                _checks.positive_int(owner, prefix + name, values[name])
        for name in _RATES:
            if name in values:
                _checks.number(owner, prefix + name, values[name], low=0.0, high=1.0,
                               high_open=True)
        sizes = [values.get(name) for name in ("qkv_dim", "num_heads")]
        if values.get("positional") == "rope" and None not in sizes:
            check_head_dim(owner, f"`{prefix}positional`='rope'", *sizes,
                           (prefix + "qkv_dim", prefix + "num_heads"))
        if "embed_init_std" in values:
            _checks.number(owner, prefix + "embed_init_std", values["embed_init_std"],
                           low=0.0, low_open=True)
        if "use_bias" in values:
            _checks.boolean(owner, prefix + "use_bias", values["use_bias"])
