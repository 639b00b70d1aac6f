"""Linen versions of the :mod:`spectral_jax.nn` models, through ``flax.nnx.bridge.to_linen``.

Each class is a regular ``flax.linen.Module`` that wraps the NNX model: under one submodule
``"model"`` for the classifiers, whose only field is the frozen
:class:`~spectral_jax.nn.TransformerConfig`; at its own level for :class:`MultiHeadAttention`,
whose fields are the NNX constructor's arguments and whose parameter tree is
``flax.linen.MultiHeadDotProductAttention``'s. Calls take the NNX model's arguments, with
its defaults and rules (``mask`` and ``deterministic`` may be left out where the NNX call
allows it). Variables live in the usual collections: ``"params"`` and, for Performer, the
non-trainable projection in ``"random_features"`` (pass every collection to ``apply``).
Randomness at ``apply``: the ``"dropout"`` rng (and optionally ``"landmarks"``) when
``deterministic=False``. The same seed gives different parameters in Linen and NNX (the
bridge draws keys differently); from the same parameters (an NNX model's
``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` as ``{"params": {"model": ...}}``) both
give the same outputs.

Pure attention functions need no wrapper: pass them as
``flax.linen.MultiHeadDotProductAttention(attention_fn=...)``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from spectral_jax import UsageError
from spectral_jax import nn as _nnx_models
from spectral_jax.attention import get_attention_spec
from spectral_jax.nn import TransformerConfig, normalise_attention_kwargs

Array = jax.Array

__all__ = ["DualEncoderClassifier", "MultiHeadAttention", "SequenceClassifier", "TransformerConfig"]


def _require_rngs(module: nn.Module, deterministic: bool | None, dropout: bool,
                  attention: str) -> None:
    """Raises unless ``apply`` got the rng streams that ``deterministic=False`` draws from.

    Without them the bridge falls back to one fixed key, so every step would reuse the same
    dropout mask and Skyformer landmarks; Linen's own ``nn.Dropout`` raises here too. With
    ``deterministic=None`` the NNX model decides: a random model raises (``deterministic``
    must be given), any other computes as in evaluation.
    """
    if deterministic is None or deterministic or module.is_initializing():
        return
    missing = []
    if dropout and not module.has_rng("dropout"):
        missing.append("'dropout'")
    samples = get_attention_spec(attention).state == "landmark_rng"
    if samples and not (module.has_rng("landmarks") or module.has_rng("dropout")):
        missing.append("'landmarks' (or 'dropout')")
    if missing:
        raise UsageError(
            f"{type(module).__name__}: deterministic=False needs the rng stream(s) "
            f"{', '.join(missing)}; pass apply(..., rngs={{'dropout': key}}). Without them "
            "every call would reuse one fixed key."
        )


def _has_dropout(config: TransformerConfig) -> bool:
    return config.dropout_rate > 0 or config.attention_dropout_rate > 0


class SequenceClassifier(nn.Module):
    """Linen :class:`spectral_jax.nn.SequenceClassifier`: int ``(B, L)`` → float32 ``(B, C)``.

    Attributes:
        config: the model configuration.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from spectral_jax.linen import SequenceClassifier, TransformerConfig
        >>> model = SequenceClassifier(TransformerConfig(vocab_size=10, num_classes=3,
        ...     max_length=8))
        >>> tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0]])
        >>> variables = model.init(jax.random.key(0), tokens, tokens > 0, deterministic=True)
        >>> model.apply(variables, tokens, tokens > 0, deterministic=True).shape
        (1, 3)
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs: Array, mask: Array | None = None, *,
                 deterministic: bool | None = None) -> Array:
        """Same arguments, result and errors as the NNX ``SequenceClassifier.__call__``.

        Raises spectral_jax.UsageError when ``deterministic=False`` needs a ``"dropout"``
        rng not given.
        """
        _require_rngs(self, deterministic, _has_dropout(self.config), self.config.attention)
        model = nnx.bridge.to_linen(_nnx_models.SequenceClassifier, self.config, name="model")
        return model(inputs, mask, deterministic=deterministic)


class DualEncoderClassifier(nn.Module):
    """Linen :class:`spectral_jax.nn.DualEncoderClassifier`: int ``(B, 2, L)`` → ``(B, C)``.

    Attributes:
        config: the model configuration (``max_length`` per document).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from spectral_jax.linen import DualEncoderClassifier, TransformerConfig
        >>> model = DualEncoderClassifier(TransformerConfig(vocab_size=10, num_classes=2,
        ...     max_length=4))
        >>> tokens = jnp.array([[[3, 4, 0, 0], [5, 6, 7, 0]]])
        >>> variables = model.init(jax.random.key(0), tokens, tokens > 0, deterministic=True)
        >>> model.apply(variables, tokens, tokens > 0, deterministic=True).shape
        (1, 2)
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs: Array, mask: Array | None = None, *,
                 deterministic: bool | None = None) -> Array:
        """Same arguments, result and errors as the NNX ``DualEncoderClassifier.__call__``.

        Raises spectral_jax.UsageError when ``deterministic=False`` needs a ``"dropout"``
        rng not given.
        """
        _require_rngs(self, deterministic, _has_dropout(self.config), self.config.attention)
        model = nnx.bridge.to_linen(
            _nnx_models.DualEncoderClassifier, self.config, name="model"
        )
        return model(inputs, mask, deterministic=deterministic)


def _with_cache(input_shape: tuple[int, ...], cache_dtype: Any, *args: Any,
                **kwargs: Any) -> _nnx_models.MultiHeadAttention:
    """The NNX module with an empty cache for ``input_shape`` (the bridge keeps the state a
    module has when built, not what a call adds at ``init``)."""
    module = _nnx_models.MultiHeadAttention(*args, **kwargs)
    module.init_cache(input_shape, cache_dtype)
    return module


class MultiHeadAttention(nn.Module):
    """Linen :class:`spectral_jax.nn.MultiHeadAttention` (self- or cross-attention).

    The fields are the NNX constructor's arguments, with its defaults and its rules:
    ``deterministic`` is needed (here or at the call) only when the layer is random
    (``dropout_rate > 0`` or a random state such as Skyformer's landmarks); ``dtype`` and
    ``param_dtype`` reach every projection and state. The NNX ``shared_state`` (an NNX
    module shared between layers) has no Linen field.

    Attributes:
        num_heads: number of heads; must divide ``qkv_features``.
        in_features: features of the inputs (last axis).
        attention: registry name, see ``spectral_jax.attention.available_attentions()``.
        attention_kwargs: method parameters and module options, a mapping such as
          ``{"num_landmarks": 32}`` (``(name, value)`` pairs are accepted too); stored as
          pairs sorted by name, so the module stays hashable.
        qkv_features: total query/key/value features (None: ``in_features``).
        out_features: output features (None: ``in_features``).
        dropout_rate: attention-weight dropout (methods with registry ``weight_dropout``).
        use_bias: biases on the projections.
        is_causal: causal attention (methods with a causal form only).
        deterministic: default for ``__call__``'s ``deterministic``.
        dtype: computation dtype (None: inferred from inputs and params).
        param_dtype: parameter dtype.
        kernel_init: initializer of the projection kernels.
        num_kv_heads: key/value heads (grouped-query attention; None: ``num_heads``).
        in_kv_features, precision, bias_init, out_kernel_init, out_bias_init, normalize_qk:
          as in Flax's attention modules (``query_ln`` / ``key_ln`` with ``normalize_qk``).
        rope: rotary positions on queries and keys, as the NNX module's ``rope``.
        qkv_dot_general, out_dot_general, qkv_dot_general_cls, out_dot_general_cls: as in
          Flax's Linen module: the projections' ``dot_general`` (e.g. a quantised one).
        decode: autoregressive decoding as in Flax's Linen module: ``init`` with inputs
          ``(batch..., max_length, in_features)`` creates the ``"cache"`` collection (the
          NNX module's cache variables, Flax's ``cached_key``/``cached_value``/
          ``cache_index`` among them) and returns the causal run; each
          ``apply(..., mutable=["cache"])`` then feeds the next token(s) (needs
          ``is_causal=True``; ``valid`` marks padding tokens).

    The variables sit at this module's level with the names and shapes of
    ``flax.linen.MultiHeadDotProductAttention``'s (``query``, ``key``, ``value``, ``out``,
    each ``kernel`` and ``bias``), so parameters move between the two; the method's own
    state (Performer's projection, Linformer's) sits beside them.

    Raises:
        spectral_jax.UsageTypeError: ``attention_kwargs`` neither a mapping nor ``(name, value)``
          pairs.
        As the NNX module otherwise (at ``init``/``apply``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from spectral_jax.linen import MultiHeadAttention
        >>> layer = MultiHeadAttention(2, 8, attention="nystrom",
        ...                            attention_kwargs={"num_landmarks": 5})
        >>> x = jnp.ones((1, 5, 8))
        >>> variables = layer.init(jax.random.key(0), x)
        >>> layer.apply(variables, x).shape
        (1, 5, 8)
    """

    num_heads: int
    in_features: int
    attention: str = "nystrom"
    attention_kwargs: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    qkv_features: int | None = None
    out_features: int | None = None
    dropout_rate: float = 0.0
    use_bias: bool = True
    is_causal: bool = False
    deterministic: bool | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable[..., Array] = nnx.initializers.xavier_uniform()
    num_kv_heads: int | None = None
    in_kv_features: int | None = None
    precision: Any = None
    bias_init: Callable[..., Array] = nnx.initializers.zeros
    out_kernel_init: Callable[..., Array] | None = None
    out_bias_init: Callable[..., Array] | None = None
    normalize_qk: bool = False
    rope: bool = False
    decode: bool = False
    qkv_dot_general: Any = None
    out_dot_general: Any = None
    qkv_dot_general_cls: Any = None
    out_dot_general_cls: Any = None

    def __post_init__(self) -> None:
        # The one stored form (hashable: Linen hashes modules by their fields).
        object.__setattr__(self, "attention_kwargs", normalise_attention_kwargs(
            "MultiHeadAttention", self.attention_kwargs))
        super().__post_init__()

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        *,
        mask: Array | None = None,
        deterministic: bool | None = None,
        carry: Array | None = None,
        return_carry: bool = False,
        inputs_v: Array | None = None,
        segment_ids: Array | None = None,
        positions: Array | None = None,
        valid: Array | None = None,
    ) -> Array | tuple[Array, Array | None]:
        """Same arguments, result and errors as the NNX ``MultiHeadAttention.__call__``
        (``rngs`` and ``sow_weights`` excepted; decoding by the ``decode`` field).

        Raises spectral_jax.UsageError when ``deterministic=False`` needs a ``"dropout"``
        rng not given.
        """
        if deterministic is None:
            deterministic = self.deterministic
        _require_rngs(self, deterministic, self.dropout_rate > 0, self.attention)
        build = _nnx_models.MultiHeadAttention
        initializing_cache = self.decode and self.is_initializing()
        if initializing_cache:  # Flax's rule: init builds the cache, runs the full input
            build = functools.partial(_with_cache, inputs_q.shape, self.dtype or inputs_q.dtype)
        layer = nnx.bridge.to_linen(
            build,
            self.num_heads,
            self.in_features,
            attention=self.attention,
            attention_kwargs=dict(self.attention_kwargs),
            qkv_features=self.qkv_features,
            out_features=self.out_features,
            dropout_rate=self.dropout_rate,
            use_bias=self.use_bias,
            is_causal=self.is_causal,
            deterministic=self.deterministic,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            num_kv_heads=self.num_kv_heads,
            in_kv_features=self.in_kv_features,
            precision=self.precision,
            bias_init=self.bias_init,
            out_kernel_init=self.out_kernel_init,
            out_bias_init=self.out_bias_init,
            normalize_qk=self.normalize_qk,
            rope=self.rope,
            decode=self.decode,
            qkv_dot_general=self.qkv_dot_general,
            out_dot_general=self.out_dot_general,
            qkv_dot_general_cls=self.qkv_dot_general_cls,
            out_dot_general_cls=self.out_dot_general_cls,
            name="attention",
        )
        # The NNX module's variables at this module's own level, as Flax's
        # MultiHeadDotProductAttention holds them (query, key, value, out).
        nn.share_scope(self, layer)
        kwargs = dict(mask=mask, deterministic=deterministic, carry=carry,
                      return_carry=return_carry, segment_ids=segment_ids, positions=positions)
        if not self.decode or initializing_cache:
            return layer(inputs_q, inputs_kv, inputs_v, **kwargs, decode=False)
        with warnings.catch_warnings():  # the bridge's fresh module meets its cache here
            warnings.filterwarnings("ignore", "Found unknown module paths")
            return layer(inputs_q, inputs_kv, inputs_v, **kwargs, valid=valid)
