"""Multi-head attention that selects an attention method by registry name and owns its state."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import attention as _attention
from spectral_jax.attention._common import FLAX_KWARGS, as_bool_mask
from spectral_jax.nn._rngs import stream as _stream

Array = jax.Array

# Keyword arguments the module computes itself; users set them through module-level options.
_MODULE_CONTROLLED = frozenset(
    {"projection", "key_projection", "value_projection", "rng", "is_causal"}
)
_LINFORMER_SHARING = ("none", "key_value", "layerwise")
# Module-level options and the methods that accept them.
_MODULE_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "conv_kernel_size": ("nystrom", "spectral_shift"),
    "num_features": ("performer",),
    "proj_len": ("linformer",),
    "sharing": ("linformer",),
    "max_length": ("linformer",),
    "symmetric": None,  # every method
}
_DEFAULT_NUM_FEATURES = 256
DEFAULT_PROJ_LEN = 128


class RandomFeatures(nnx.Variable):
    """Performer's random projection: state that is not trained and never redrawn implicitly.

    Not an ``nnx.Param``, so ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` skips it; it is still
    part of ``nnx.state(model)`` and so of every checkpoint. In Linen (via ``nnx.bridge``) it
    lives in the ``"random_features"`` collection.
    """


nnx.register_variable_name("random_features", RandomFeatures)


# Arrays that describe one call's inputs; a module takes them through `mask` instead.
_PER_CALL = frozenset({"query_seq_lengths", "key_value_seq_lengths"})


def _method_parameters(fn: Any) -> frozenset[str]:
    """Names of the method parameters of an attention function (not q/k/v/bias/mask)."""
    params = inspect.signature(fn).parameters.values()
    return frozenset(
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.name not in ("query", "key", "value", "bias", "mask")
    )


def allowed_attention_kwargs(attention: str) -> frozenset[str]:
    """The ``attention_kwargs`` keys :class:`MultiHeadAttention` takes for a registered method.

    Example:
        >>> sorted(allowed_attention_kwargs("linear"))
        ['chunk_size', 'eps', 'feature_map', 'head_chunk_size', 'scale', 'symmetric']
    """
    spec = _attention.get_attention_spec(attention)
    params = _method_parameters(spec.fn) - FLAX_KWARGS - _MODULE_CONTROLLED - _PER_CALL
    options = {k for k, methods in _MODULE_OPTIONS.items() if methods is None or attention in methods}
    return frozenset(params | options)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")


class MultiHeadAttention(nnx.Module):
    """Multi-head attention whose core is any registered ``spectral_jax.attention`` method.

    Query, key and value are projected to ``num_heads`` heads of ``qkv_features // num_heads``
    features, attended with the chosen method, and projected back to ``out_features``. The
    module owns each method's state and translates module-level options (in
    ``attention_kwargs``) into the pure function's arguments:

    - ``conv_kernel_size`` (nystrom, spectral_shift): odd int or None (off). Adds
      Nyströmformer's depthwise convolution skip on V: one length-``k`` filter per head along
      the sequence, shared by the head's channels, zero padding, no bias (Xiong et al. 2021,
      ``mlpen/Nystromformer`` ``attention_nystrom.py``; the reference codes use 33, 35, 65).
    - ``num_features`` (performer, default 256): rows of the orthogonal random projection,
      stored as :class:`RandomFeatures` (not trained) and changed only by :meth:`redraw`.
    - ``proj_len`` (default 128), ``sharing`` (``"none"``: separate key and value projections;
      ``"key_value"``: one for both; ``"layerwise"``: one for both and for every layer, owned by
      the encoder and passed to ``__call__``) and ``max_length`` (required) for linformer
      (Wang et al. 2020, §4). Learned ``nnx.Param`` of shape ``(proj_len, max_length)``.
    - ``symmetric`` (every method, default False): the key projection is the query
      projection, so scores are ``Q Qᵀ`` (Courtois et al. 2024, Findings of ACL,
      "Symmetric Dot-Product Attention").

    Skyformer samples landmarks from the ``"landmarks"`` rng stream (else ``"dropout"``)
    when ``deterministic=False``; with ``deterministic=True`` it uses fixed evenly spaced
    landmarks, so two evaluation calls are bitwise equal. Every other key of
    ``attention_kwargs`` goes to the attention function unchanged and must be one of its
    parameters.

    Args:
        num_heads: number of heads; must divide ``qkv_features``.
        in_features: features of the inputs (last axis).
        attention: registry name, see ``spectral_jax.attention.available_attentions()``.
        attention_kwargs: method parameters and the module options above.
        qkv_features: total query/key/value features (default ``in_features``).
        out_features: output features (default ``in_features``).
        dropout_rate: dropout on the attention weights; only exact ``"softmax"`` attention
          has weights to drop, so other methods require 0.
        use_bias: biases on the query/key/value/output projections.
        is_causal: causal self-attention; only for methods with a causal form.
        deterministic: default for ``__call__``'s ``deterministic``.
        dtype: computation dtype (None: inferred from inputs and params).
        param_dtype: parameter dtype.
        rngs: ``"params"`` for weights, ``"features"`` (else ``"params"``) for the Performer
          projection, ``"dropout"`` and ``"landmarks"`` for training-time randomness.

    Raises:
        ValueError: unknown attention name (the message lists the known ones); ``num_heads``
          not dividing ``qkv_features``; an unknown key in ``attention_kwargs`` or a module
          option the method does not take; a bad option value; ``dropout_rate`` > 0 for a
          method other than softmax.
        NotImplementedError: ``is_causal=True`` for a method without a causal form.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0))
        >>> layer(jnp.ones((1, 5, 8)), deterministic=True).shape
        (1, 5, 8)
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        *,
        attention: str = "nystrom",
        attention_kwargs: Mapping[str, Any] | None = None,
        qkv_features: int | None = None,
        out_features: int | None = None,
        dropout_rate: float = 0.0,
        use_bias: bool = True,
        is_causal: bool = False,
        deterministic: bool | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_init: nnx.Initializer = nnx.initializers.xavier_uniform(),
        rngs: nnx.Rngs,
    ) -> None:
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("in_features", in_features)
        qkv_features = in_features if qkv_features is None else qkv_features
        out_features = in_features if out_features is None else out_features
        _check_positive_int("qkv_features", qkv_features)
        _check_positive_int("out_features", out_features)
        if qkv_features % num_heads:
            raise ValueError(
                f"num_heads must divide qkv_features={qkv_features}, got num_heads={num_heads}."
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}.")
        spec = _attention.get_attention_spec(attention)
        if dropout_rate > 0.0 and attention != "softmax":
            raise ValueError(
                f"dropout_rate={dropout_rate} drops attention weights, which only attention="
                f"'softmax' forms; got attention={attention!r}. Use dropout_rate=0."
            )
        if is_causal and not spec.supports_causal:
            causal = [
                n
                for n in _attention.available_attentions()
                if _attention.get_attention_spec(n).supports_causal
            ]
            raise NotImplementedError(
                f"attention={attention!r} has no causal form (is_causal=True); methods with "
                f"one: {causal}."
            )
        kwargs = dict(attention_kwargs or {})
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _MODULE_OPTIONS}
        for name in options:
            allowed = _MODULE_OPTIONS[name]
            if allowed is not None and attention not in allowed:
                raise ValueError(
                    f"attention_kwargs[{name!r}] applies to attention in {list(allowed)}, "
                    f"got attention={attention!r}."
                )
        allowed = allowed_attention_kwargs(attention)
        for name in kwargs:
            if name in _PER_CALL:
                raise ValueError(
                    f"attention_kwargs[{name!r}] is per-call data, not a module option; pass "
                    "the padding to __call__ as `mask` (e.g. nnx.make_attention_mask)."
                )
            if name not in allowed:
                raise ValueError(
                    f"attention_kwargs has unknown key {name!r} for attention={attention!r}; "
                    f"allowed: {sorted(allowed)}."
                )

        if kwargs.get("head_chunk_size") is not None:
            _check_positive_int("attention_kwargs['head_chunk_size']", kwargs["head_chunk_size"])
        self.num_heads = num_heads
        self.head_dim = qkv_features // num_heads
        self.attention = attention
        # A sorted tuple keeps the module's static data hashable (one jit cache entry).
        self.attention_kwargs = tuple(sorted(kwargs.items()))
        self.dropout_rate = dropout_rate
        self.is_causal = is_causal
        self.deterministic = deterministic
        self.dtype = dtype
        self.symmetric = bool(options.get("symmetric", False))

        dense = dict(
            use_bias=use_bias,
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=kernel_init,
            rngs=rngs,
        )
        heads = (num_heads, self.head_dim)
        self.query = nnx.LinearGeneral(in_features, heads, **dense)
        self.key = None if self.symmetric else nnx.LinearGeneral(in_features, heads, **dense)
        self.value = nnx.LinearGeneral(in_features, heads, **dense)
        self.out = nnx.LinearGeneral(heads, out_features, axis=(-2, -1), **dense)
        self.dropout_rng = _stream(rngs, "dropout", "params").fork() if dropout_rate else None

        self.conv_kernel = nnx.data(None)
        conv_kernel_size = options.get("conv_kernel_size")
        if conv_kernel_size is not None:
            _check_positive_int("attention_kwargs['conv_kernel_size']", conv_kernel_size)
            if conv_kernel_size % 2 == 0:
                raise ValueError(
                    "attention_kwargs['conv_kernel_size'] must be odd (same-length "
                    f"convolution), got {conv_kernel_size}."
                )
            # PyTorch Conv default init (uniform, fan_in = kernel size), as the reference code.
            init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0)
            self.conv_kernel = nnx.Param(
                init(rngs.params(), (conv_kernel_size, 1, num_heads), param_dtype)
            )

        self.projection = nnx.data(None)
        if attention == "performer":
            num_features = options.get("num_features", _DEFAULT_NUM_FEATURES)
            _check_positive_int("attention_kwargs['num_features']", num_features)
            self.num_features = num_features
            key = _stream(rngs, "features", "params")()
            self.projection = RandomFeatures(self._draw(key))

        self.landmark_rng = nnx.data(None)
        if spec.state == "rng":
            self.landmark_rng = _stream(rngs, "landmarks", "dropout", "params").fork()

        self.sharing = None
        self.key_projection = nnx.data(None)
        self.value_projection = nnx.data(None)
        if attention == "linformer":
            self.sharing = options.get("sharing", "none")
            if self.sharing not in _LINFORMER_SHARING:
                raise ValueError(
                    f"attention_kwargs['sharing'] must be one of {list(_LINFORMER_SHARING)}, "
                    f"got {self.sharing!r}."
                )
            if "max_length" not in options:
                raise ValueError(
                    "attention='linformer' needs attention_kwargs['max_length'] (the longest "
                    "key sequence); got none."
                )
            self.max_length = options["max_length"]
            self.proj_len = options.get("proj_len", DEFAULT_PROJ_LEN)
            _check_positive_int("attention_kwargs['max_length']", self.max_length)
            _check_positive_int("attention_kwargs['proj_len']", self.proj_len)
            if self.sharing != "layerwise":
                self.key_projection = init_linformer_projection(
                    self.proj_len, self.max_length, param_dtype=param_dtype, rngs=rngs
                )
            if self.sharing == "none":
                self.value_projection = init_linformer_projection(
                    self.proj_len, self.max_length, param_dtype=param_dtype, rngs=rngs
                )

    def _draw(self, key: Array) -> Array:
        return _attention.orthogonal_random_features(key, self.num_features, self.head_dim)

    def redraw(self, rng: Array) -> None:
        """Draws a new Performer projection from ``rng`` (Choromanski et al. 2021, §3).

        Args:
            rng: a JAX PRNG key.

        Raises:
            ValueError: the module's attention is not ``"performer"``.

        Example:
            >>> import jax
            >>> from flax import nnx
            >>> from spectral_jax.nn import MultiHeadAttention
            >>> layer = MultiHeadAttention(2, 8, attention="performer",
            ...     attention_kwargs={"num_features": 16}, rngs=nnx.Rngs(0))
            >>> layer.redraw(jax.random.key(1))
            >>> layer.projection.shape
            (16, 4)
        """
        if self.projection is None:
            raise ValueError(
                f"redraw() needs attention='performer', got attention={self.attention!r}."
            )
        self.projection[...] = self._draw(rng)

    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        *,
        mask: Array | None = None,
        deterministic: bool | None = None,
        linformer_projection: Array | None = None,
    ) -> Array:
        """Attends from ``inputs_q`` to ``inputs_kv`` (self-attention when None).

        Args:
            inputs_q: ``(batch..., q_len, in_features)``, float.
            inputs_kv: ``(batch..., kv_len, in_features)`` or None (= ``inputs_q``).
            mask: bool, True = attend, broadcastable to ``(batch..., num_heads, q_len,
              kv_len)`` (e.g. from ``nnx.make_attention_mask``), or None.
            deterministic: no dropout and fixed Skyformer landmarks; defaults to the
              constructor's value.
            linformer_projection: ``(proj_len, max_length)`` shared projection, required
              with ``sharing="layerwise"`` (the encoder owns it) and refused otherwise.

        Returns:
            ``(batch..., q_len, out_features)`` in the computation dtype.

        Raises:
            ValueError: ``deterministic`` given nowhere; feature size or mask shape mismatch;
              a Linformer ``kv_len`` above ``max_length``; ``linformer_projection`` missing
              for ``sharing="layerwise"`` or given otherwise; the conv skip with
              ``q_len != kv_len``.
        """
        if deterministic is None:
            deterministic = self.deterministic
        if deterministic is None:
            raise ValueError(
                "deterministic must be given to MultiHeadAttention (call or constructor), "
                "got None in both."
            )
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        query = self.query(inputs_q)
        key = self.query(inputs_kv) if self.key is None else self.key(inputs_kv)
        value = self.value(inputs_kv)
        if mask is not None:  # Flax's make_attention_mask defaults to float 1/0
            mask = as_bool_mask("MultiHeadAttention", mask)

        kwargs = dict(self.attention_kwargs)
        if self.is_causal:
            kwargs["is_causal"] = True
        if self.projection is not None:
            kwargs["projection"] = self.projection[...]
        if self.landmark_rng is not None and not deterministic:
            kwargs["rng"] = self.landmark_rng()
        if self.sharing is not None:
            kwargs.update(self._linformer_kwargs(key.shape[-3], linformer_projection))
        elif linformer_projection is not None:
            raise ValueError(
                f"linformer_projection is only for attention='linformer' with "
                f"sharing='layerwise', got attention={self.attention!r}."
            )

        if self.dropout_rate and not deterministic:
            # Only softmax gets here (checked in __init__): the same call as in evaluation,
            # plus its Flax dropout keywords, so scale, causality and padding agree.
            kwargs.update(dropout_rng=self.dropout_rng(), dropout_rate=self.dropout_rate,
                          broadcast_dropout=False, deterministic=False)
        x = _attention.get_attention(self.attention)(query, key, value, mask=mask, **kwargs)

        if self.conv_kernel is not None:
            x = x + self._conv_skip(value, mask, query.shape[-3])
        return self.out(x)

    def _linformer_kwargs(self, kv_len: int, shared: Array | None) -> dict[str, Array]:
        if kv_len > self.max_length:
            raise ValueError(
                f"Linformer key length must be <= attention_kwargs['max_length']="
                f"{self.max_length}, got kv_len={kv_len}."
            )
        if self.sharing == "layerwise":
            if shared is None:
                raise ValueError(
                    "sharing='layerwise' needs linformer_projection (proj_len, max_length) "
                    "from the encoder that owns it, got None."
                )
            return {"key_projection": shared}
        if shared is not None:
            raise ValueError(
                f"linformer_projection is only for sharing='layerwise', got "
                f"sharing={self.sharing!r}."
            )
        value = None if self.value_projection is None else self.value_projection[...]
        return {"key_projection": self.key_projection[...], "value_projection": value}

    def _conv_skip(self, value: Array, mask: Array | None, q_len: int) -> Array:
        """Depthwise conv along the sequence of ``value`` (batch..., L, H, D), padding zeroed."""
        length, heads, dim = value.shape[-3:]
        if length != q_len:
            raise ValueError(
                f"conv_kernel_size needs self-attention lengths, got q_len={q_len} and "
                f"kv_len={length}."
            )
        if mask is not None:
            valid = jnp.any(mask, axis=-2)  # (batch..., heads|1, kv_len)
            valid = jnp.any(valid, axis=-2) if valid.ndim >= 2 else valid
            value = value * jnp.expand_dims(valid, (-1, -2)).astype(value.dtype)
        batch = value.shape[:-3]
        # (batch..., L, H, D) -> (batch·D, L, H): heads are the conv's feature groups.
        v = jnp.moveaxis(value.reshape(-1, length, heads, dim), -1, 1).reshape(-1, length, heads)
        kernel = self.conv_kernel[...].astype(v.dtype)
        y = jax.lax.conv_general_dilated(
            v,
            kernel,
            window_strides=(1,),
            padding="SAME",
            dimension_numbers=("NWC", "WIO", "NWC"),
            feature_group_count=heads,
        )
        y = jnp.moveaxis(y.reshape(-1, dim, length, heads), 1, -1)
        return y.reshape(*batch, length, heads, dim)


def init_linformer_projection(
    proj_len: int, max_length: int, *, param_dtype: Any = jnp.float32, rngs: nnx.Rngs
) -> nnx.Param:
    """A learned Linformer length projection ``(proj_len, max_length)``, Xavier-uniform.

    Xavier-uniform with gain 1/√2 follows fairseq's ``MultiheadLinearAttention`` (Wang et al.
    2020). Inputs shorter than ``max_length`` use its first columns.

    Args:
        proj_len: projected length k.
        max_length: longest key sequence n.
        param_dtype: dtype of the parameter.
        rngs: the ``"params"`` stream draws it.

    Returns:
        ``nnx.Param`` of shape ``(proj_len, max_length)``.

    Example:
        >>> from flax import nnx
        >>> init_linformer_projection(4, 16, rngs=nnx.Rngs(0)).shape
        (4, 16)
    """
    init = nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform")
    return nnx.Param(init(rngs.params(), (proj_len, max_length), param_dtype))


def redraw_features(model: nnx.Module, rng: Array) -> int:
    """Redraws every Performer projection in ``model``; a no-op for other models.

    Each :class:`MultiHeadAttention` with ``attention="performer"`` gets its own key,
    ``jax.random.fold_in(rng, i)`` for the i-th such module in graph order.

    Args:
        model: any NNX module.
        rng: a JAX PRNG key.

    Returns:
        The number of projections redrawn.

    Example:
        >>> import jax
        >>> from flax import nnx
        >>> layer = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0))
        >>> redraw_features(layer, jax.random.key(0))
        0
    """
    count = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, MultiHeadAttention) and module.projection is not None:
            module.redraw(jax.random.fold_in(rng, count))
            count += 1
    return count
