"""The query, key, value and output projections of :class:`MultiHeadAttention`, built from
Flax's constructor fields (``flax.nnx.MultiHeadAttention``): the same submodule names
(``query``, ``key``, ``value``, ``out``, and ``query_ln`` / ``key_ln`` with ``normalize_qk``),
the same initializer fallbacks and the same ``precision`` on every projection."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from spectral_jax import UnsupportedError
from spectral_jax.nn._symmetric import PairwiseScores

Array = jax.Array


def build(module: nnx.Module, *, in_features: int, in_kv_features: int, out_features: int,
          use_bias: bool, dtype: Any, param_dtype: Any, precision: Any,
          kernel_init: nnx.Initializer, bias_init: nnx.Initializer,
          out_kernel_init: nnx.Initializer | None, out_bias_init: nnx.Initializer | None,
          normalize_qk: bool, rngs: nnx.Rngs) -> None:
    """Sets ``module.query``, ``key`` (None when symmetric), ``pairwise``, ``value``,
    ``query_ln``, ``key_ln`` and ``out`` from ``module.num_heads``, ``num_kv_heads``,
    ``head_dim`` and ``symmetric``.

    ``out_kernel_init`` / ``out_bias_init`` default to ``kernel_init`` / ``bias_init``;
    ``normalize_qk`` adds a LayerNorm without bias over each head's query and key features
    (Dehghani et al. 2023, ViT-22B §3.1), as Flax does.

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
    init = dict(kernel_init=kernel_init, bias_init=bias_init)
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
        module.query_ln = nnx.LayerNorm(module.head_dim, **norm)
        module.key_ln = nnx.LayerNorm(module.head_dim, **norm)
    module.out = nnx.LinearGeneral(
        heads, out_features, axis=(-2, -1), kernel_init=out_kernel_init or kernel_init,
        bias_init=out_bias_init or bias_init, **dense)


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
