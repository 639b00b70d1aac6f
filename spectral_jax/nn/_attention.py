"""Multi-head attention that selects an attention method by registry name and owns its state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import _checks
from spectral_jax import attention as _attention
from spectral_jax.nn import _decode, _projections
from spectral_jax.nn._attention_kwargs import (
    check_carry,
    check_features,
    check_hashable,
    check_kv_heads,
    check_layer,
    check_segment_call,
    dropout_key,
    normalise_attention_kwargs,
    resolve_deterministic,
    split_attention_kwargs,
)
from spectral_jax.nn._layer_inputs import core_inputs
from spectral_jax.nn._recurrent_layer import RecurrentLayerParts, check_layer_options
from spectral_jax.nn._rngs import stream as _stream
from spectral_jax.nn._rope import check_positions, check_rope
from spectral_jax.nn._state import STATE_MODULES, ConvSkip, redraw_state, uses_rng
from spectral_jax.nn._symmetric import check_symmetric
from spectral_jax.parallel import attention_function

Array = jax.Array

_XAVIER_UNIFORM = nnx.initializers.xavier_uniform()


class MultiHeadAttention(nnx.Module):
    """Multi-head attention whose core is any registered ``spectral_jax.attention`` method.

    Query, key and value are projected to ``num_heads`` heads of ``qkv_features // num_heads``
    features, attended with the chosen method, and projected back to ``out_features``. The
    module owns the state its method's registry entry names, as ``self.state``: one module
    per kind from :data:`~spectral_jax.nn.STATE_MODULES`, each returning the keyword
    arguments it contributes. ``attention_kwargs`` holds the function's parameters and the
    module options (:func:`module_options`):

    - the state kind's options, with the defaults :func:`module_options` lists: e.g.
      ``num_features`` (:class:`RandomFeatures`, changed only by :meth:`redraw`); ``proj_len``,
      ``sharing`` (``"layerwise"``: one projection for every layer, passed as
      ``shared_state``) and ``max_length`` for length projections (Wang et al. 2020, §4).
    - ``conv_kernel_size`` (methods whose entry allows it): odd int or None (off); adds
      Nyströmformer's depthwise convolution skip on V (:class:`~spectral_jax.nn.ConvSkip`).
    - ``short_conv_size``, ``output_gate`` (the recurrent family; defaults: the paper's layer,
      registry ``layer``): :mod:`spectral_jax.nn._recurrent_layer`.
    - ``symmetric`` (every method, default False): True: the key projection is the query
      projection, so scores are ``Q Qᵀ`` (Courtois et al. 2024, Findings of ACL,
      "Symmetric Dot-Product Attention"); ``"pairwise"``: scores ``Q Σ_h Qᵀ`` with a learned
      d×d matrix per head; ``"pairwise_psd"``: the same with Σ_h = L_h L_hᵀ, so query =
      key = Q L_h (:class:`PairwiseScores`).

    A landmark rng stream (``"landmarks"``, else ``"dropout"``) gives Skyformer a fresh key
    when ``deterministic=False``; with ``deterministic=True`` it uses fixed evenly spaced
    landmarks, so two evaluation calls are bitwise equal. Every other key of
    ``attention_kwargs`` goes to the attention function unchanged and must be one of its
    parameters.

    Args:
        num_heads: number of heads; must divide ``qkv_features``.
        in_features: features of the inputs (last axis).
        attention: registry name, see ``spectral_jax.attention.available_attentions()``.
        attention_kwargs: method parameters and the module options above, a mapping
          (``(name, value)`` pairs are accepted too).
        qkv_features: total query/key/value features (default ``in_features``).
        out_features: output features (default ``in_features``).
        dropout_rate: dropout on the attention weights; only methods that form the weights
          (registry ``weight_dropout``, i.e. exact softmax) allow it, others require 0.
        use_bias: biases on the query/key/value/output projections.
        is_causal: causal self-attention; only for methods with a causal form.
        rope: rotate queries and keys by their positions before the attention method (even
          head dimension; RoFormer; :func:`spectral_jax.nn.apply_rope`, whose docstring says
          what each approximation then approximates).
        deterministic: default for ``__call__``'s ``deterministic`` (needed only when the
          layer is random: ``dropout_rate > 0`` or a random state such as Skyformer's).
        dtype: computation dtype (None: inferred from inputs and params).
        param_dtype: parameter dtype.
        shared_state: a state module shared with other layers (Linformer's layer-wise
          projection, from ``LengthProjectionState.shared``); None: the module builds its own.
        rngs: ``"params"`` for weights, ``"features"`` (else ``"params"``) for the Performer
          projection, ``"dropout"`` and ``"landmarks"`` for training-time randomness.
        decode: default for ``__call__``'s ``decode``: autoregressive decoding from the cache
          that :meth:`init_cache` creates, as in ``flax.nnx.MultiHeadAttention``; needs
          ``is_causal=True`` and a method with a decode form
          (``spectral_jax.attention.decode_methods()``).
        num_kv_heads: key/value heads (grouped-query attention; None: ``num_heads``), a
          divisor of ``num_heads``; the decode cache then holds these heads only.
        in_kv_features: features of the key/value inputs (default ``in_features``).
        precision, bias_init, out_kernel_init, out_bias_init, normalize_qk: as in Flax's
          module (:mod:`spectral_jax.nn._projections`); ``precision`` is the projections'.
        keep_rngs: False: no dropout stream is kept; pass ``rngs`` to the call.
        **flax_fields: Flax's projection and norm fields, as Flax passes them:
          ``qkv_/out_/ln_promote_dtype``, ``qkv_/out_dot_general(_cls)``,
          ``(out_)kernel_metadata``, ``(out_)bias_metadata``,
          ``query_ln/key_ln_scale_metadata`` (:data:`~spectral_jax.nn._projections.FLAX_FIELDS`).

    Raises:
        spectral_jax.UsageError: unknown attention name (the message lists the known ones);
          an unknown keyword argument;
          ``num_heads`` not dividing ``qkv_features``; an unknown key in ``attention_kwargs``
          or a module option the method does not take; a bad option value; ``dropout_rate`` > 0
          for a method without attention weights; ``sharing="layerwise"`` without
          ``shared_state``; ``rope`` with an odd head dimension.
        spectral_jax.UsageTypeError: ``attention_kwargs`` neither a mapping nor ``(name, value)``
          pairs, or holding an unhashable value.
        spectral_jax.UnsupportedError: ``is_causal=True`` for a method without a causal form;
          ``is_causal=False`` for a causal-only method (``gated_linear``); ``decode=True``
          for a method without a decode form or with ``is_causal=False``.

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
        rope: bool = False,
        deterministic: bool | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_init: nnx.Initializer = _XAVIER_UNIFORM,
        shared_state: nnx.Module | None = None,
        decode: bool = False,
        num_kv_heads: int | None = None,
        in_kv_features: int | None = None,
        precision: Any = None,
        bias_init: nnx.Initializer = nnx.initializers.zeros,
        out_kernel_init: nnx.Initializer | None = None,
        out_bias_init: nnx.Initializer | None = None,
        normalize_qk: bool = False,
        keep_rngs: bool = True,
        rngs: nnx.Rngs,
        **flax_fields: Any,
    ) -> None:
        in_kv_features = in_features if in_kv_features is None else in_kv_features
        qkv_features = in_features if qkv_features is None else qkv_features
        out_features = in_features if out_features is None else out_features
        spec = _attention.get_attention_spec(attention)
        check_layer(spec, num_heads, in_features, qkv_features, out_features, dropout_rate,
                     is_causal)
        pairs = normalise_attention_kwargs("MultiHeadAttention", attention_kwargs, hashed=False)
        kwargs, options = split_attention_kwargs(spec, dict(pairs))
        check_hashable("MultiHeadAttention", pairs)  # static module data: hashed under jit
        self.num_heads = num_heads
        self.num_kv_heads = check_kv_heads(num_heads, num_kv_heads, options)
        self.in_features = in_features
        self.in_kv_features = _checks.positive_int("MultiHeadAttention", "in_kv_features",
                                                   in_kv_features)
        self.head_dim = qkv_features // num_heads
        self.attention = attention
        # A sorted tuple keeps the module's static data hashable (one jit cache entry).
        self.attention_kwargs = tuple(sorted(kwargs.items()))
        self.dropout_rate = dropout_rate
        self.is_causal = is_causal
        self.rope = check_rope("MultiHeadAttention", rope, qkv_features, num_heads)
        self.deterministic = deterministic
        self.uses_rng = uses_rng(spec, dropout_rate)
        self.dtype = dtype
        self.decode = decode
        if decode:
            _decode.check_decode(spec, is_causal)
        self.symmetric = check_symmetric(options["symmetric"])

        _projections.build(
            self, in_features=in_features, in_kv_features=in_kv_features,
            out_features=out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
            precision=precision, kernel_init=kernel_init, bias_init=bias_init,
            out_kernel_init=out_kernel_init, out_bias_init=out_bias_init,
            normalize_qk=normalize_qk, rngs=rngs,
            fields=_projections.check_fields("MultiHeadAttention", flax_fields))
        self.dropout_rng = (_stream(rngs, "dropout", "params").fork()
                            if dropout_rate and keep_rngs else None)

        self.conv_skip = nnx.data(None)
        if options.get("conv_kernel_size") is not None:
            self.conv_skip = ConvSkip(options["conv_kernel_size"], num_heads=num_heads,
                                      param_dtype=param_dtype, rngs=rngs)
        self.layer_parts = nnx.data(None)
        if spec.layer is not None and any(v is not None for v in check_layer_options(options)):
            self.layer_parts = RecurrentLayerParts(
                *check_layer_options(options), in_features=in_features, num_heads=num_heads,
                num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, dtype=dtype,
                param_dtype=param_dtype, rngs=rngs)
        self.state = nnx.data(None)
        if shared_state is not None:
            self.state = shared_state
        elif spec.state is not None:
            per_key = _attention.STATE_KINDS[spec.state].per_key_head
            self.state = STATE_MODULES[spec.state](  # it reads the key/value inputs
                options, in_features=in_kv_features, head_dim=self.head_dim,
                num_heads=self.num_kv_heads if per_key else num_heads,
                dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    @property
    def method(self) -> _attention.AttentionSpec:
        """The registry entry of ``attention``: what the layer's helpers receive (derived
        from the name, so the module's state and repr hold the name alone)."""
        return _attention.get_attention_spec(self.attention)

    def redraw(self, rng: Array) -> None:
        """Draws new random features from ``rng`` (Choromanski et al. 2021, §3).

        Args:
            rng: a JAX PRNG key.

        Raises:
            spectral_jax.UsageError: the module's method has no random features.

        Example:
            >>> import jax
            >>> from flax import nnx
            >>> from spectral_jax.nn import MultiHeadAttention
            >>> layer = MultiHeadAttention(2, 8, attention="performer",
            ...     attention_kwargs={"num_features": 16}, rngs=nnx.Rngs(0))
            >>> layer.redraw(jax.random.key(1))
            >>> layer.state.projection.shape
            (16, 4)
        """
        redraw_state(self.state, self.method, rng)

    def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32) -> None:
        """Creates the decoding cache for inputs ``(batch..., max_length, in_features)``.

        The cache holds the method's :class:`~spectral_jax.attention.DecodeState` (its
        registry ``decode`` form: a key/value cache, a ring buffer, running sums or memory
        slots; :attr:`decode_state`) as ``nnx.Cache`` variables named as Flax names them:
        ``cached_key``, ``cached_value`` (layout ``(batch..., num_kv_heads, max_length,
        head_dim)``: each step reads a head's rows contiguously), ``cached_<name>`` for
        the form's other arrays, and ``cache_index`` (:mod:`spectral_jax.nn._decode`).
        Calling it again empties the cache.

        Args:
            input_shape: ``(batch..., max_length, in_features)``.
            dtype: dtype of stored keys and values (running sums are float32).

        Raises:
            spectral_jax.UsageError: a shape without ``in_features`` on its last axis.
            spectral_jax.UnsupportedError: a method without a decode form, or
              ``is_causal=False``.

        Example:
            >>> import jax.numpy as jnp
            >>> from flax import nnx
            >>> from spectral_jax.nn import MultiHeadAttention
            >>> layer = MultiHeadAttention(2, 8, attention="linear", is_causal=True,
            ...                            decode=True, rngs=nnx.Rngs(0))
            >>> layer.init_cache((3, 100, 8))
            >>> layer(jnp.ones((3, 1, 8))).shape, layer.decode_state.nbytes
            ((3, 1, 8), 480)
        """
        _decode.check_decode(self.method, self.is_causal)
        _decode.store(self, _decode.init_state(self, input_shape, dtype))
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))
        if self.layer_parts is not None:  # the short convolution's last inputs
            self.conv_state = nnx.Cache(self.layer_parts.init_cache(tuple(input_shape[:-2]),
                                                                    dtype))

    @property
    def decode_state(self) -> _attention.DecodeState:
        """The cache as a :class:`~spectral_jax.attention.DecodeState` (after
        :meth:`init_cache`)."""
        return _decode.load(self)

    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        inputs_v: Array | None = None,
        *,
        mask: Array | None = None,
        deterministic: bool | None = None,
        carry: Array | None = None,
        return_carry: bool = False,
        positions: Array | None = None,
        decode: bool | None = None,
        valid: Array | None = None,
        segment_ids: Array | None = None,
        rngs: nnx.Rngs | None = None,
        sow_weights: bool = False,
    ) -> Array | tuple[Array, Array | None]:
        """Attends from ``inputs_q`` to ``inputs_kv`` (self-attention when None).

        Args:
            inputs_q: ``(batch..., q_len, in_features)``, float.
            inputs_kv: keys' inputs ``(batch..., kv_len, in_kv_features)`` or None
              (= ``inputs_q``); Flax's ``inputs_k``.
            inputs_v: values' inputs, the shape of ``inputs_kv``, or None (= ``inputs_kv``).
            mask: bool, True = attend, broadcastable to ``(batch..., num_heads, q_len,
              kv_len)`` (e.g. from ``nnx.make_attention_mask``), or None.
            deterministic: no dropout and fixed Skyformer landmarks; defaults to the
              constructor's value; may be left out everywhere when the layer has nothing
              random (see :func:`uses_rng`).
            carry: the state a method with a registry ``carry`` (Luna) hands from layer to
              layer: the previous layer's P ``(batch..., packed_length, in_features)``;
              None: the module's own learned first P. Refused for other methods.
            return_carry: also return the next layer's carry (None for methods without).
            positions: only with ``rope``: int ``(q_len,)`` or ``(batch, q_len)`` positions of the
              queries (and of the keys when ``kv_len == q_len``; other keys take
              ``arange(kv_len)``); None: ``arange(q_len)``, or in decode mode each token's
              position in its example (its count of earlier valid tokens).
            decode: decode from the cache (default: the constructor's ``decode``): the
              ``q_len`` tokens of ``inputs_q`` (usually 1) are fed in order, each attending
              to the cache and entering it; self-attention only, no ``mask``.
            valid: decode only: bool ``(batch...)`` or ``(batch..., q_len)``, False for a
              padding token (e.g. left padding): it neither enters the cache nor advances
              its example's position, and its output is the output projection of zeros.
            segment_ids: int ``(batch..., length)``, packed sequences (no ``decode``): a token
              attends within its segment only; rotary positions then restart per segment.
            rngs: the ``"dropout"`` stream of this call (needed with ``keep_rngs=False``).
            sow_weights: sow the attention weights as ``attention_weights`` in
              ``nnx.Intermediate`` (methods that form them: registry ``weight_dropout``).

        Returns:
            ``(batch..., q_len, out_features)`` in the computation dtype; with
            ``return_carry``, ``(output, next_carry)``.

        Raises:
            spectral_jax.UsageError: ``deterministic`` given nowhere for a random layer; feature
              size or mask shape mismatch; a Linformer ``kv_len`` above ``max_length``; the
              conv skip with ``q_len != kv_len``; ``carry`` for a method without one, or of the
              wrong shape; decode without :meth:`init_cache`, with ``inputs_kv`` or ``mask``,
              or with inputs of another batch shape than the cache's; a token past the
              cache's ``max_length`` (concrete inputs; under jit that example's outputs turn
              NaN, see :func:`~spectral_jax.attention.decode_step`).
        """
        decode = self.decode if decode is None else decode
        check_positions("MultiHeadAttention", self.rope, positions)
        deterministic = resolve_deterministic(self, deterministic, sow_weights)
        check_features("inputs_q", inputs_q, self.in_features)
        for name, x in (("inputs_kv", inputs_kv), ("inputs_v", inputs_v)):
            x is None or check_features(name, x, self.in_kv_features, "in_kv_features")
        check_segment_call(self.method, segment_ids, decode=decode,
                           conv_skip=self.conv_skip is not None)
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        query, key, value, mask, state, valid = core_inputs(
            self, inputs_q, inputs_kv, inputs_v, mask=mask, positions=positions, decode=decode,
            deterministic=deterministic, valid=valid, segment_ids=segment_ids)
        if decode:
            x = _decode.decode_call(self, state, inputs_q, query, key, value, valid)
            x = x if self.layer_parts is None else self.layer_parts.finish(x, inputs_q)
            return (self.out(x), None) if return_carry else self.out(x)

        spec = self.method
        check_carry(spec, carry)
        kwargs = dict(self.attention_kwargs, **({} if segment_ids is None
                                                 else {"segment_ids": segment_ids}))
        if self.is_causal:
            kwargs["is_causal"] = True
        if self.state is not None:
            kwargs.update(self.state(kv_len=key.shape[-3], deterministic=deterministic,
                                     inputs=inputs_kv, carry=carry))

        if self.dropout_rate and not deterministic:
            # Only softmax (weight_dropout) gets here: the same call as in evaluation,
            # plus its Flax dropout keywords, so scale, causality and padding agree.
            kwargs.update(dropout_rng=dropout_key(self, rngs), dropout_rate=self.dropout_rate,
                          broadcast_dropout=False, deterministic=False)
        if sow_weights:
            kwargs["module"] = self
        next_carry = None
        # The registered function, or its sequence-sharded form inside split_sequence().
        fn = attention_function(spec)
        if spec.carry is not None:
            kwargs[spec.carry[1]] = True
            x, packed = fn(query, key, value, mask=mask, **kwargs)
            next_carry = self.state.next_carry(packed, carry)
        else:
            x = fn(query, key, value, mask=mask, **kwargs)

        if self.conv_skip is not None:
            x = x + self.conv_skip(value, mask, query.shape[-3])
        if self.layer_parts is not None:
            x = self.layer_parts.finish(x, inputs_q)
        return (self.out(x), next_carry) if return_carry else self.out(x)
