"""The query, key, value and output projections of :class:`MultiHeadAttention`, built from
Flax's constructor fields (``flax.nnx.MultiHeadAttention``): the same submodule names
(``query``, ``key``, ``value``, ``out``, and ``query_ln`` / ``key_ln`` with ``normalize_qk``),
the same initializer fallbacks and the same ``precision`` on every projection."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.nn._symmetric import PairwiseScores

Array = jax.Array

# Flax's fields that only configure the projections and norms, passed through as Flax passes
# them (flax.nnx.MultiHeadAttention; Linen has the four *_dot_general* ones).
FLAX_FIELDS = ("qkv_promote_dtype", "out_promote_dtype", "ln_promote_dtype",
               "qkv_dot_general", "out_dot_general", "qkv_dot_general_cls",
               "out_dot_general_cls", "kernel_metadata", "out_kernel_metadata",
               "bias_metadata", "out_bias_metadata", "query_ln_scale_metadata",
               "key_ln_scale_metadata")


def check_fields(owner: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with None values dropped (Flax's defaults then apply).

    Raises:
      spectral_jax.UsageError: a name that is not one of :data:`FLAX_FIELDS`.
    """
    unknown = sorted(set(fields) - set(FLAX_FIELDS))
    if unknown:
        raise UsageError(f"{owner}: unknown keyword argument(s) {unknown}; the Flax fields "
                         f"passed to the projections are {list(FLAX_FIELDS)}.")
    return {n: v for n, v in fields.items() if v is not None}


def _part(fields: dict[str, Any], prefix: str, out: bool) -> dict[str, Any]:
    """The LinearGeneral keywords of the q/k/v (``prefix="qkv"``) or output projection."""
    kw = {name: fields[f"{prefix}_{name}"] for name in ("promote_dtype", "dot_general",
                                                          "dot_general_cls")
          if f"{prefix}_{name}" in fields}
    for name in ("kernel_metadata", "bias_metadata"):  # the output's fall back, as Flax's
        value = (fields.get(f"out_{name}") or fields.get(name)) if out else fields.get(name)
        if value:
            kw[name] = value
    return kw


def build(module: nnx.Module, *, in_features: int, in_kv_features: int, out_features: int,
          use_bias: bool, dtype: Any, param_dtype: Any, precision: Any,
          kernel_init: nnx.Initializer, bias_init: nnx.Initializer,
          out_kernel_init: nnx.Initializer | None, out_bias_init: nnx.Initializer | None,
          normalize_qk: bool, rngs: nnx.Rngs, fields: dict[str, Any] | None = None) -> None:
    """Sets ``module.query``, ``key`` (None when symmetric), ``pairwise``, ``value``,
    ``query_ln``, ``key_ln`` and ``out`` from ``module.num_heads``, ``num_kv_heads``,
    ``head_dim`` and ``symmetric``.

    ``out_kernel_init`` / ``out_bias_init`` default to ``kernel_init`` / ``bias_init``;
    ``normalize_qk`` adds a LayerNorm without bias over each head's query and key features
    (Dehghani et al. 2023, ViT-22B §3.1), as Flax does. ``fields``: Flax's pass-through
    fields (:data:`FLAX_FIELDS`, checked by :func:`check_fields`).

    Raises:
      spectral_jax.UnsupportedError: ``symmetric`` with ``in_kv_features != in_features``
        (the key is then the query projection of the key/value inputs).
    """
    if module.symmetric and in_kv_features != in_features:
        raise UnsupportedError(
            f"MultiHeadAttention: symmetric={module.symmetric!r} projects keys with the query "
            f"projection, so in_kv_features must equal in_features={in_features}; got "
            f"{in_kv_features}.")
    dense = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, precision=precision,
                 rngs=rngs)
    heads = (module.num_heads, module.head_dim)
    kv_heads = (module.num_kv_heads, module.head_dim)
    fields = fields or {}
    init = dict(kernel_init=kernel_init, bias_init=bias_init, **_part(fields, "qkv", False))
    module.query = nnx.LinearGeneral(in_features, heads, **init, **dense)
    module.key = (None if module.symmetric
                  else nnx.LinearGeneral(in_kv_features, kv_heads, **init, **dense))
    module.pairwise = nnx.data(None)
    if isinstance(module.symmetric, str):
        module.pairwise = PairwiseScores(module.num_heads, module.head_dim,
                                         psd=module.symmetric == "pairwise_psd",
                                         param_dtype=param_dtype, rngs=rngs)
    module.value = nnx.LinearGeneral(in_kv_features, kv_heads, **init, **dense)
    module.query_ln = module.key_ln = nnx.data(None)
    if normalize_qk:
        norm = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        if "ln_promote_dtype" in fields:
            norm["promote_dtype"] = fields["ln_promote_dtype"]
        module.query_ln = nnx.LayerNorm(module.head_dim, **norm, scale_metadata=fields.get(
            "query_ln_scale_metadata") or {})
        module.key_ln = nnx.LayerNorm(module.head_dim, **norm, scale_metadata=fields.get(
            "key_ln_scale_metadata") or {})
    module.out = nnx.LinearGeneral(
        heads, out_features, axis=(-2, -1), kernel_init=out_kernel_init or kernel_init,
        bias_init=out_bias_init or bias_init, **_part(fields, "out", True), **dense)


def project(module: nnx.Module, inputs_q: Array, inputs_k: Array,
            inputs_v: Array) -> tuple[Array, Array, Array]:
    """Query ``(..., q_len, H, d)``, key and value ``(..., kv_len, H_kv, d)``: projected,
    then normalised (``normalize_qk``), then mixed by the pairwise score matrix."""
    query = module.query(inputs_q)
    key = module.query(inputs_k) if module.key is None else module.key(inputs_k)
    value = module.value(inputs_v)
    if module.query_ln is not None:
        query, key = module.query_ln(query), module.key_ln(key)
    if module.pairwise is not None:
        query, key = module.pairwise(query, key)
    return query, key, value
