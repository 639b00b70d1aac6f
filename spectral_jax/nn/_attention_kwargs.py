"""Which keyword arguments a :class:`~spectral_jax.nn.MultiHeadAttention` layer takes, and
the checks of its sizes, dropout and causality, all derived from the method's registry entry.
Training configs use the same rules (``model.attention_kwargs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from spectral_jax import UnsupportedError, UsageError
from spectral_jax import attention as _attention
from spectral_jax.attention._common import FLAX_KWARGS
from spectral_jax.nn._checks import check_positive_int
from spectral_jax.nn._state import STATE_MODULES

# Arrays that describe one call's inputs; a module takes them through `mask` instead.
_PER_CALL = frozenset({"query_seq_lengths", "key_value_seq_lengths"})


def module_options(attention: str) -> dict[str, Any]:
    """The module options :class:`MultiHeadAttention` takes for a method, with defaults.

    Its state kind's options (registry ``STATE_KINDS``), ``conv_kernel_size`` where the
    method allows the conv skip, and ``symmetric`` for every method.

    Example:
        >>> module_options("performer")
        {'num_features': 256, 'symmetric': False}
    """
    spec = _attention.get_attention_spec(attention)
    options = dict(spec.state_kind.options) if spec.state_kind is not None else {}
    if spec.conv_skip:
        options["conv_kernel_size"] = None
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
    ) - FLAX_KWARGS - _PER_CALL


def allowed_attention_kwargs(attention: str) -> frozenset[str]:
    """The ``attention_kwargs`` keys :class:`MultiHeadAttention` takes for a registered method.

    Example:
        >>> sorted(allowed_attention_kwargs("linear"))
        ['chunk_size', 'eps', 'feature_map', 'head_chunk_size', 'scale', 'symmetric']
    """
    spec = _attention.get_attention_spec(attention)
    return _function_parameters(spec) | frozenset(module_options(attention))


def split_attention_kwargs(
    attention: str, attention_kwargs: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Checks ``attention_kwargs`` and splits it into function arguments and module options.

    Returns:
        ``(function_kwargs, options)``; ``options`` has every module option of the method,
        at its default where not given.

    Raises:
        spectral_jax.UsageError: a per-call array, a module option of another method or an unknown key.
    """
    kwargs = dict(attention_kwargs or {})
    own = module_options(attention)
    every = {k for name in _attention.available_attentions() for k in module_options(name)}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in every}
    for name in given:
        if name not in own:
            users = [n for n in _attention.available_attentions() if name in module_options(n)]
            raise UsageError(
                f"attention_kwargs[{name!r}] applies to attention in {users}, "
                f"got attention={attention!r}."
            )
    allowed = allowed_attention_kwargs(attention)
    for name in kwargs:
        if name in _PER_CALL:
            raise UsageError(
                f"attention_kwargs[{name!r}] is per-call data, not a module option; pass "
                "the padding to __call__ as `mask` (e.g. nnx.make_attention_mask)."
            )
        if name not in allowed:
            raise UsageError(
                f"attention_kwargs has unknown key {name!r} for attention={attention!r}; "
                f"allowed: {sorted(allowed)}."
            )
    if kwargs.get("head_chunk_size") is not None:
        check_positive_int("attention_kwargs['head_chunk_size']", kwargs["head_chunk_size"])
    return kwargs, {**own, **given}


def uses_rng(attention: str, dropout_rate: float = 0.0) -> bool:
    """Whether a layer of ``attention`` draws randomness in training (then ``deterministic``
    must be given, as for Flax's attention modules): weight dropout, or random state.

    Example:
        >>> uses_rng("nystrom"), uses_rng("skyformer"), uses_rng("softmax", 0.1)
        (False, True, True)
    """
    spec = _attention.get_attention_spec(attention)
    state = STATE_MODULES.get(spec.state) if spec.state is not None else None
    return dropout_rate > 0.0 or (state is not None and getattr(state, "random", True))


def _check_layer(spec: _attention.AttentionSpec, num_heads: int, in_features: int,
                 qkv_features: int, out_features: int, dropout_rate: float,
                 is_causal: bool) -> None:
    """The layer's sizes, and dropout and causality against what the method supports."""
    for name, value in (("num_heads", num_heads), ("in_features", in_features),
                        ("qkv_features", qkv_features), ("out_features", out_features)):
        check_positive_int(name, value)
    if qkv_features % num_heads:
        raise UsageError(
            f"num_heads must divide qkv_features={qkv_features}, got num_heads={num_heads}."
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise UsageError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}.")
    names = _attention.available_attentions()
    if dropout_rate > 0.0 and not spec.weight_dropout:
        droppable = [n for n in names if _attention.get_attention_spec(n).weight_dropout]
        raise UsageError(
            f"dropout_rate={dropout_rate} drops attention weights, which only attention in "
            f"{droppable} forms; got attention={spec.name!r}. Use dropout_rate=0."
        )
    if is_causal and not spec.supports_causal:
        causal = [n for n in names if _attention.get_attention_spec(n).supports_causal]
        raise UnsupportedError(
            f"attention={spec.name!r} has no causal form (is_causal=True); methods with "
            f"one: {causal}."
        )
    if spec.causal_only and not is_causal:
        raise UnsupportedError(
            f"attention={spec.name!r} is causal only (a recurrence over positions): pass "
            "is_causal=True (TransformerConfig.is_causal / config model.is_causal)."
        )
