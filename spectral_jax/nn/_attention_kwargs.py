"""Which keyword arguments a :class:`~spectral_jax.nn.MultiHeadAttention` layer takes, their
one stored form, and the checks of its sizes, dropout and causality, all derived from the
method's registry entry. Training configs use the same rules (``model.attention_kwargs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax import attention as _attention
from spectral_jax.attention._registry import methods_where

# Arrays that describe one call's inputs; a module takes them through `mask` and its
# call's `segment_ids` instead.
_PER_CALL = frozenset({"query_seq_lengths", "key_value_seq_lengths", "segment_ids",
                       "query_segment_ids", "kv_segment_ids"})
# jax.nn's keywords and the causal alignment: the layer calls its method at equal lengths,
# through its own decode form, so these are the functions' concern, not the layer's options.
_CALL_FORM = frozenset({"local_window_size", "implementation", "causal_alignment"})
_OWNER = "MultiHeadAttention"


def normalise_attention_kwargs(owner: str, value: Any, *,
                               hashed: bool = True) -> tuple[tuple[str, Any], ...]:
    """``attention_kwargs`` in its one stored form: ``(name, value)`` pairs sorted by name.

    Every module and config takes a mapping (``{"num_landmarks": 64}``); a sequence of
    ``(name, value)`` pairs is accepted too. The stored form is hashable, so a frozen config
    or a module's static data that holds it can be hashed (one jit cache entry), and it is
    the same for the same contents in any form or order.

    Args:
        owner: who asks, for the message (``"TransformerConfig"``).
        value: a mapping of str to hashable values, a sequence of ``(str, value)`` pairs, or
          None (none).
        hashed: check that every value is hashable; False leaves it to a later
          :func:`check_hashable` (after the names have been checked against the method).

    Returns:
        A tuple of ``(name, value)`` pairs sorted by name.

    Raises:
        spectral_jax.UsageTypeError: neither a mapping nor pairs; a name that is not a str;
          a value that is not hashable (e.g. a list: give a tuple).
        spectral_jax.UsageError: a name given twice among pairs.

    Example:
        >>> from spectral_jax.nn import normalise_attention_kwargs
        >>> normalise_attention_kwargs("f()", {"num_landmarks": 8, "conv_kernel_size": 3})
        (('conv_kernel_size', 3), ('num_landmarks', 8))
        >>> normalise_attention_kwargs("f()", [("num_landmarks", 8)])
        (('num_landmarks', 8),)
    """
    what = "a mapping of parameter names to values, e.g. {'num_landmarks': 64}"
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)) and all(
            isinstance(item, (tuple, list)) and len(item) == 2 for item in value):
        items = [tuple(item) for item in value]
    else:
        raise UsageTypeError(_checks.message(owner, "attention_kwargs", what, value))
    seen = set()
    for name, _ in items:
        if not isinstance(name, str):
            raise UsageTypeError(_checks.message(owner, "attention_kwargs",
                                                 what + " (str names)", value))
        if name in seen:
            raise UsageError(_checks.message(owner, "attention_kwargs",
                                             "pairs with distinct names", value))
        seen.add(name)
    pairs = tuple(sorted(items, key=lambda pair: pair[0]))
    if hashed:
        check_hashable(owner, pairs)
    return pairs


def check_hashable(owner: str, pairs: tuple[tuple[str, Any], ...]) -> None:
    """Raises UsageTypeError naming the first ``attention_kwargs`` value that cannot be hashed."""
    for name, item in pairs:
        try:
            hash(item)
        except TypeError:
            raise UsageTypeError(_checks.message(
                owner, f"attention_kwargs[{name!r}]",
                "hashable (a number, str, bool, None or tuple), as configs and modules are "
                "hashed", item)) from None


def module_options(attention: str | _attention.AttentionSpec) -> dict[str, Any]:
    """The module options :class:`MultiHeadAttention` takes for a method, with defaults.

    Its state kind's options (registry ``STATE_KINDS``), ``conv_kernel_size`` where the
    method allows the conv skip, the paper layer's options where its entry has a ``layer``
    (``short_conv_size``, ``output_gate``), and ``symmetric`` for every method.

    Example:
        >>> module_options("performer")
        {'num_features': 256, 'symmetric': False}
    """
    spec = _attention.get_attention_spec(attention)
    options = dict(spec.state_kind.options) if spec.state_kind is not None else {}
    if spec.conv_skip:
        options["conv_kernel_size"] = None
    options.update(spec.layer or ())
    return {**options, "symmetric": False}


def _function_parameters(spec: _attention.AttentionSpec) -> frozenset[str]:
    """The parameters of the method's function a user may set (not inputs, state or masks)."""
    state = spec.state_kind.arguments if spec.state_kind is not None else ()
    carry_flag = (spec.carry[1],) if spec.carry is not None else ()
    params = inspect.signature(spec.fn).parameters.values()
    return frozenset(
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.name not in ("query", "key", "value", "bias", "mask", "is_causal", *state,
                           *carry_flag)
    ) - _attention.FLAX_KWARGS - _PER_CALL - _CALL_FORM


def allowed_attention_kwargs(attention: str | _attention.AttentionSpec) -> frozenset[str]:
    """The ``attention_kwargs`` keys :class:`MultiHeadAttention` takes for a registered method.

    Example:
        >>> sorted(allowed_attention_kwargs("linear"))
        ['chunk_size', 'eps', 'feature_map', 'head_chunk_size', 'scale', 'symmetric']
    """
    spec = _attention.get_attention_spec(attention)
    return _function_parameters(spec) | frozenset(module_options(spec))


def split_attention_kwargs(
    spec: _attention.AttentionSpec, attention_kwargs: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Checks ``attention_kwargs`` for the method of ``spec`` and splits it into function
    arguments and module options.

    Returns:
        ``(function_kwargs, options)``; ``options`` has every module option of the method,
        at its default where not given.

    Raises:
        spectral_jax.UsageError: a per-call array, a module option of another method or an
          unknown key.
    """
    kwargs = dict(attention_kwargs or {})
    own = module_options(spec)
    every = {k for every_spec in _attention.ATTENTIONS.values() for k in module_options(every_spec)}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in every}
    for name in given:
        if name not in own:
            users = methods_where(lambda other, name=name: name in module_options(other))
            raise UsageError(
                f"attention_kwargs[{name!r}] applies to attention in {users}, "
                f"got attention={spec.name!r}."
            )
    allowed = allowed_attention_kwargs(spec)
    for name in kwargs:
        if name in _PER_CALL:
            raise UsageError(
                f"attention_kwargs[{name!r}] is per-call data, not a module option; pass "
                "the padding to __call__ as `mask` (e.g. nnx.make_attention_mask)."
            )
        if name not in allowed:
            raise UsageError(
                f"attention_kwargs has unknown key {name!r} for attention={spec.name!r}; "
                f"allowed: {sorted(allowed)}."
            )
    if kwargs.get("head_chunk_size") is not None:
        _checks.positive_int(_OWNER, "attention_kwargs['head_chunk_size']",
                             kwargs["head_chunk_size"])
    return kwargs, {**own, **given}


def check_layer(spec: _attention.AttentionSpec, num_heads: int, in_features: int,
                 qkv_features: int, out_features: int, dropout_rate: float,
                 is_causal: bool) -> None:
    """The layer's sizes, and dropout and causality against what the method supports."""
    for name, value in (("num_heads", num_heads), ("in_features", in_features),
                        ("qkv_features", qkv_features), ("out_features", out_features)):
        _checks.positive_int(_OWNER, name, value)
    if qkv_features % num_heads:
        raise UsageError(
            f"num_heads must divide qkv_features={qkv_features}, got num_heads={num_heads}."
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise UsageError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}.")
    if dropout_rate > 0.0 and not spec.weight_dropout:
        droppable = methods_where(lambda other: other.weight_dropout)
        raise UsageError(
            f"dropout_rate={dropout_rate} drops attention weights, which only attention in "
            f"{droppable} forms; got attention={spec.name!r}. Use dropout_rate=0."
        )
    if is_causal and not spec.supports_causal:
        causal = methods_where(lambda other: other.supports_causal)
        raise UnsupportedError(
            f"attention={spec.name!r} has no causal form (is_causal=True); methods with "
            f"one: {causal}."
        )
    if spec.causal_only and not is_causal:
        raise UnsupportedError(
            f"attention={spec.name!r} is causal only (a recurrence over positions): pass "
            "is_causal=True (TransformerConfig.is_causal / config model.is_causal)."
        )


def check_features(name: str, inputs: Any, in_features: int,
                   field: str = "in_features") -> None:
    """Raises unless ``inputs`` is ``(batch..., length, in_features)``."""
    import jax.numpy as jnp

    shape = jnp.shape(inputs)
    if len(shape) < 2 or shape[-1] != in_features:
        raise UsageError(
            f"MultiHeadAttention: `{name}` must be (batch..., length, {field}) with "
            f"{field}={in_features} on its last axis; got shape {shape}"
            + (f" (last axis {shape[-1]})." if shape else ".")
        )


def check_segment_call(spec: _attention.AttentionSpec, segment_ids: Any, *, decode: bool,
                       conv_skip: bool) -> None:
    """Refuses segment ids where the layer would mix segments: decoding (the cache holds
    one sequence per example) and Nyströmformer's conv skip (its kernel spans them)."""
    if segment_ids is None:
        return
    if decode:
        raise UsageError(f"{_OWNER}: `segment_ids` with decode; decode one sequence per "
                         "example (prefill it whole, or one document per row).")
    if conv_skip:
        raise UnsupportedError(
            f"{_OWNER}: `segment_ids` with conv_kernel_size: the conv skip of "
            f"attention={spec.name!r} spans segment boundaries; build the layer without it.")


def check_kv_heads(num_heads: int, num_kv_heads: Any, options: Mapping[str, Any]) -> int:
    """The layer's key/value head count: ``num_heads`` when None, else a divisor of it, with
    no module option that needs the heads equal (every method's function groups heads).

    Raises:
      spectral_jax.UsageError: not a positive divisor of ``num_heads``.
      spectral_jax.UnsupportedError: grouped heads with ``symmetric`` (the key projection is
        the query projection) or ``conv_kernel_size`` (a skip per query head on V).
    """
    if num_kv_heads is None:
        return num_heads
    _checks.positive_int(_OWNER, "num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise UsageError(f"{_OWNER}: `num_kv_heads` must divide num_heads={num_heads} "
                         f"(grouped-query attention); got {num_kv_heads}.")
    parts = [name for name in ("symmetric", "conv_kernel_size")
             if options.get(name) not in (None, False)]
    if num_kv_heads != num_heads and parts:
        raise UnsupportedError(
            f"{_OWNER}: num_kv_heads={num_kv_heads} < num_heads={num_heads} with {parts} is "
            "not implemented: those options need as many key/value heads as query heads; "
            "every method takes grouped heads without them.")
    return num_kv_heads


def resolve_deterministic(module: Any, deterministic: bool | None, sow_weights: bool) -> bool:
    """The call's ``deterministic`` (else the constructor's; else True for a layer with
    nothing random), after checking ``sow_weights`` against the method.

    Raises:
      spectral_jax.UsageError: None in both places for a random layer.
      spectral_jax.UnsupportedError: ``sow_weights`` for a method that forms no weights.
    """
    if sow_weights and not module.method.weight_dropout:
        formed = methods_where(lambda other: other.weight_dropout)
        raise UnsupportedError(
            f"{_OWNER}: sow_weights=True needs attention weights; attention="
            f"{module.attention!r} forms none (methods that do: {formed}).")
    if deterministic is None:
        deterministic = module.deterministic
    if deterministic is None and module.uses_rng:
        raise UsageError(
            f"deterministic must be given to MultiHeadAttention (call or constructor) for "
            f"attention={module.attention!r} with dropout_rate={module.dropout_rate}: it is "
            "random in training (deterministic=False) and not in evaluation (True); got "
            "None in both.")
    return True if deterministic is None else deterministic


def dropout_key(module: Any, rngs: Any) -> Any:
    """The dropout key of a training call: from the call's ``rngs`` when given, else from the
    stream the module keeps.

    Raises:
      spectral_jax.UsageError: neither (``keep_rngs=False`` and no ``rngs``).
    """
    if rngs is not None:
        return rngs.dropout()
    if module.dropout_rng is None:
        raise UsageError(
            f"{_OWNER}: dropout_rate={module.dropout_rate} with keep_rngs=False needs the "
            "call's `rngs` (an nnx.Rngs with a 'dropout' stream) when deterministic=False; "
            "got rngs=None.")
    return module.dropout_rng()


def check_carry(spec: _attention.AttentionSpec, carry: Any) -> None:
    """Raises UsageError for a ``carry`` given to a method without a registry ``carry``."""
    if carry is not None and spec.carry is None:
        raise UsageError(
            f"carry is the state a layer hands to the next (Luna's P); attention="
            f"{spec.name!r} has none, got an array of shape {carry.shape}.")
