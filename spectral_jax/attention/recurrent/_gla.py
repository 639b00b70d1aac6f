"""Gated linear attention (GLA), simple GLA and RetNet: the additive recurrence with decay.

S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ(s·q_t): a per-key-dimension log-decay
(GLA), one per head and token (simple GLA), or one fixed per head (RetNet). Computed by the
chunked form of :mod:`spectral_jax.attention.recurrent._chunk`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common
from spectral_jax.attention.recurrent import _family

Array = jax.Array


def _log_decay(method: str, name: str, g: Any, query: Array, heads: _family.Heads,
               trailing: tuple[int, ...]) -> Array:
    g = _family.per_state(method, name, g, query.shape[:-3], query.shape[-3], heads.state,
                          trailing)
    _family.check_range(method, name, g, -math.inf, 0.0,
                        "a log-decay, e.g. logsigmoid(x) or -softplus(x)")
    return g


@_common.drop_in_signature
def gla_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, g: Array, scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 16, segment_ids: Array | None = None,
    initial_state: Array | None = None, return_final_state: bool = False,
    query_seq_lengths: Array | None = None, key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None, **flax_kwargs: Any,
) -> Any:
    """Gated linear attention: a state decayed per key dimension by data-dependent gates.

    Per state head, S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ and o_t = S_tᵀ(s·q_t), S_0 = 0
    (or ``initial_state``). Chunked: C × C × d_k decayed scores inside each chunk, the
    state carried between chunks, O(n·C·d_k + n·d_k·d_v). The same inputs give the same
    numbers as fla's ``chunk_gla(q, k, v, g, scale)`` (``[B, T, H, K]`` layout, natural-log
    gates, ``scale=None`` meaning d_k^{-1/2}).

    Args:
      query: float ``(batch..., n, H_q, d_k)``; bf16 in, bf16 out (float32 state).
      key: float ``(batch..., n, H_k, d_k)``.
      value: float ``(batch..., n, H_v, d_v)``; ``H_v`` a multiple of ``H_k``, ``H_q`` a
        multiple of ``H_v`` (grouped queries) or equal to ``H_k`` (grouped values).
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch..., H_q, n, n)``: padded
        tokens neither write nor decay the state, padded queries give zeros.
      g: float ``(batch..., n, H_v, d_k)`` log-decays ≤ 0 (e.g. ``logsigmoid(x) / 16``, as
        GLA's layer makes them); batch and heads may be 1; d_k may be 1 (simple GLA).
      scale: s; None means d_k^{-1/2}.
      is_causal: must be True (the recurrence is causal).
      chunk_size: tokens per chunk (any; the length need not divide by it).
      segment_ids: optional int ``(batch..., n)``: packed sequences; the state is dropped
        where the id changes.
      initial_state: optional ``(batch..., H_v, d_k, d_v)`` S_0.
      return_final_state: also return the float32 state after the last token.
      query_seq_lengths, key_value_seq_lengths: optional int ``(batch...,)`` valid lengths.
      head_chunk_size: (example, state head) slices computed at once (as every method's);
        None: all on accelerators, about 4096 tokens' worth per step on CPU.
      **flax_kwargs: Flax ``attention_fn`` keywords; weight dropout asked for raises.

    Returns:
      ``(batch..., n, max(H_q, H_v), d_v)`` in query's dtype; with ``return_final_state``,
      ``(out, state)`` with state ``(batch..., H_v, d_k, d_v)``.

    Raises:
      spectral_jax.UsageError: bad shapes or head counts, positive log-decays (concrete
        values), ``bias`` given, bad ``segment_ids`` or ``initial_state``.
      spectral_jax.UnsupportedError: ``is_causal=False``.

    References:
      Yang, Wang, Shen, Panda & Kim 2024, "Gated Linear Attention Transformers with
      Hardware-Efficient Training", ICML, eq. 3 and §4 (the chunked form).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import gla_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> g = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (2, 100, 4, 16)))
      >>> gla_attention(q, k, v, g=g).shape
      (2, 100, 4, 16)
    """
    method = "gla_attention"
    arguments = dict(locals())
    heads = _family.check_call(method, query, key, value, bias, mask, is_causal, flax_kwargs)
    # A trailing dim of 1 is one decay per head (simple GLA's special case).
    width = 1 if getattr(g, "ndim", 0) and g.shape[-1] == 1 else key.shape[-1]
    g = _log_decay(method, "g", g, query, heads, (width,))
    return _family.run(method, query, key, value, mask, g=g, beta=None, qk_l2norm=False,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))


@_common.drop_in_signature
def simple_gla_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, g: Array, scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 64, segment_ids: Array | None = None,
    initial_state: Array | None = None, return_final_state: bool = False,
    query_seq_lengths: Array | None = None, key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None, **flax_kwargs: Any,
) -> Any:
    """Simple GLA: one data-dependent log-decay per head and token (fla's
    ``chunk_simple_gla(q, k, v, g)``), S_t = e^{g_t} S_{t−1} + k_t v_tᵀ.

    As :func:`gla_attention`, with ``g`` float ``(batch..., n, H_v)`` ≤ 0 (batch and heads
    may be 1); C × C scalar decays inside chunks, O(n·C·(d_k + d_v) + n·d_k·d_v).

    References:
      Yang et al. 2024 (GLA), §4.4; Sun et al. 2023 (RetNet) with data-dependent decay.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import simple_gla_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> simple_gla_attention(q, k, v, g=jnp.full((1, 100, 4), -0.1)).shape
      (2, 100, 4, 16)
    """
    method = "simple_gla_attention"
    arguments = dict(locals())
    heads = _family.check_call(method, query, key, value, bias, mask, is_causal, flax_kwargs)
    g = _log_decay(method, "g", g, query, heads, ())[..., None]
    return _family.run(method, query, key, value, mask, g=g, beta=None, qk_l2norm=False,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))


def retnet_decays(num_heads: int, dtype: Any = jnp.float32) -> Array:
    """RetNet's fixed log-decays per head, log(1 − 2^{−5−h}) for h = 0..H−1 (``(H,)`` in ``dtype``;
    Sun et al. 2023, §2.2, as fla's ``chunk_retention``).

    Example:
      >>> from spectral_jax.attention.recurrent import retnet_decays
      >>> [round(float(x), 5) for x in retnet_decays(2)]
      [-0.03175, -0.01575]
    """
    return jnp.log1p(-(2.0 ** (-5.0 - jnp.arange(num_heads, dtype=dtype))))


@_common.drop_in_signature
def retnet_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, scale: float | None = None, is_causal: bool = True,
    chunk_size: int = 64, segment_ids: Array | None = None,
    initial_state: Array | None = None, return_final_state: bool = False,
    query_seq_lengths: Array | None = None, key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None, **flax_kwargs: Any,
) -> Any:
    """Retention (RetNet): simple GLA with the fixed decay γ_h = 1 − 2^{−5−h} of state head h.

    S_t = γ_h S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ(s·q_t); the same numbers as fla's
    ``chunk_retention(q, k, v, scale)``. Arguments, returns and errors as
    :func:`simple_gla_attention`, without ``g``.

    References:
      Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large Language
      Models", eq. 1-8 (the recurrent and chunkwise forms; the rotation goes in the layer).

    Example:
      >>> import jax
      >>> from spectral_jax.attention.recurrent import retnet_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> retnet_attention(q, k, v).shape
      (2, 100, 4, 16)
    """
    method = "retnet_attention"
    arguments = dict(locals())
    heads = _family.check_call(method, query, key, value, bias, mask, is_causal, flax_kwargs)
    g = jnp.broadcast_to(retnet_decays(heads.state, _common.compute_dtype(query.dtype))[:, None],
                         (*query.shape[:-3], query.shape[-3], heads.state, 1))
    return _family.run(method, query, key, value, mask, g=g, beta=None, qk_l2norm=False,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))
