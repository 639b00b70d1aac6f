"""The delta rule: DeltaNet, Gated DeltaNet and Kimi Delta Attention (KDA).

S' = Diag(e^{g_t}) S_{t−1};  S_t = S' + β_t k_t (v_t − S'ᵀk_t)ᵀ;  o_t = S_tᵀ(s·q_t): each
token corrects what the state predicted for its key by a step β_t toward its value (g = 0:
DeltaNet; one log-decay per head and token: Gated DeltaNet; one per key dimension: KDA).
Chunked with the UT transform (:mod:`spectral_jax.attention.recurrent._chunk`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common
from spectral_jax.attention.recurrent import _family

Array = jax.Array


def _inputs(method: str, query: Array, key: Array, value: Array, bias: Any, mask: Any,
            is_causal: Any, flax_kwargs: dict[str, Any], g: Any, beta: Any,
            g_trailing: tuple[int, ...] | None) -> tuple[Array, Array]:
    heads = _family.check_call(method, query, key, value, bias, mask, is_causal, flax_kwargs)
    batch_shape, n = query.shape[:-3], query.shape[-3]
    beta = _family.per_state(method, "beta", beta, batch_shape, n, heads.state)
    _family.check_range(method, "beta", beta, 0.0, 2.0,
                        "a write strength: sigmoid(x), or 2·sigmoid(x) for negative eigenvalues")
    if g_trailing is None:
        return jnp.zeros((*batch_shape, n, heads.state, 1), jnp.float32), beta
    g = _family.per_state(method, "g", g, batch_shape, n, heads.state, g_trailing)
    _family.check_range(method, "g", g, -math.inf, 0.0,
                        "a log-decay, e.g. -exp(A_log)·softplus(x + dt_bias)")
    return (g if g_trailing else g[..., None]), beta


@_common.drop_in_signature
def deltanet_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, beta: Array, scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 64, qk_l2norm: bool = True,
    segment_ids: Array | None = None, initial_state: Array | None = None,
    return_final_state: bool = False, query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None, head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Any:
    """DeltaNet: linear attention whose state is corrected by the delta rule.

    Per state head, S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀk_t)ᵀ = (I − β_t k_t k_tᵀ) S_{t−1}
    + β_t k_t v_tᵀ and o_t = S_tᵀ(s·q_t). With unit keys and β ∈ [0, 2] every transition
    has eigenvalues in [−1, 1]; unnormalised keys can make the state grow, hence
    ``qk_l2norm`` (fla's ``use_qk_l2norm_in_kernel``: q and k divided by √(Σx² + 1e-6)).
    Chunked by the UT transform, O(n·C·(d_k + d_v) + n·d_k·d_v). The same inputs give the
    same numbers as fla's ``chunk_delta_rule(q, k, v, beta, scale)``.

    Args:
      query, key, value: as :func:`spectral_jax.attention.recurrent.gla_attention`.
      mask, scale, is_causal, chunk_size, segment_ids: as ``gla_attention``.
      initial_state, return_final_state: as ``gla_attention``.
      query_seq_lengths, key_value_seq_lengths, head_chunk_size: as ``gla_attention``.
      **flax_kwargs: as ``gla_attention``.
      bias: must be None.
      beta: float ``(batch..., n, H_v)`` in [0, 2] (σ(x), or 2σ(x) to allow negative
        eigenvalues); batch and heads may be 1.
      qk_l2norm: L2-normalise q and k inside (fla's ``use_qk_l2norm_in_kernel``; fla's
        layers always normalise, its kernels only when asked: pass False to port a kernel
        call that does not).

    Returns:
      ``(batch..., n, max(H_q, H_v), d_v)`` in query's dtype (and the final state with
      ``return_final_state``).

    Raises:
      spectral_jax.UsageError: bad shapes or head counts, β outside [0, 2] (concrete
        values), ``bias`` given. spectral_jax.UnsupportedError: ``is_causal=False``.

    References:
      Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight
      Programmers", eq. 29; Yang, Wang, Zhang, Shen & Kim 2024, "Parallelizing Linear
      Transformers with the Delta Rule over Sequence Length", NeurIPS, §3 (UT transform).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import deltanet_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> deltanet_attention(q, k, v, beta=jnp.full((1, 100, 4), 0.5), qk_l2norm=True).shape
      (2, 100, 4, 16)
    """
    method = "deltanet_attention"
    arguments = dict(locals())
    g, beta = _inputs(method, query, key, value, bias, mask, is_causal,
                      flax_kwargs, None, beta, None)
    return _family.run(method, query, key, value, mask, g=g, beta=beta, qk_l2norm=qk_l2norm,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))


@_common.drop_in_signature
def gated_deltanet_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, g: Array, beta: Array, scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 64, qk_l2norm: bool = True,
    segment_ids: Array | None = None, initial_state: Array | None = None,
    return_final_state: bool = False, query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None, head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Any:
    """Gated DeltaNet: the delta rule on a state first decayed by e^{g_t}.

    S' = e^{g_t} S_{t−1}, S_t = S' + β_t k_t (v_t − S'ᵀk_t)ᵀ, o_t = S_tᵀ(s·q_t): the decay
    comes before the error, as fla's ``chunk_gated_delta_rule(q, k, v, g, beta, scale)``,
    whose numbers the same inputs give.

    Args:
      g: float ``(batch..., n, H_v)`` log-decays ≤ 0 (the layer makes
        −exp(A_log)·softplus(a + dt_bias)); batch and heads may be 1.
      beta: float ``(batch..., n, H_v)`` in [0, 2].
      the rest: as :func:`deltanet_attention`.

    Returns:
      As :func:`deltanet_attention`.

    Raises:
      spectral_jax.UsageError: as :func:`deltanet_attention`, and positive log-decays.

    References:
      Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta
      Rule", ICLR, eq. 10 and §3.3 (the chunked form).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import gated_deltanet_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> gated_deltanet_attention(q, k, v, g=jnp.full((1, 100, 4), -0.05),
      ...                          beta=jnp.full((1, 100, 4), 0.5), qk_l2norm=True).shape
      (2, 100, 4, 16)
    """
    method = "gated_deltanet_attention"
    arguments = dict(locals())
    g, beta = _inputs(method, query, key, value, bias, mask, is_causal,
                      flax_kwargs, g, beta, ())
    return _family.run(method, query, key, value, mask, g=g, beta=beta, qk_l2norm=qk_l2norm,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))


@_common.drop_in_signature
def kda_attention(
    query: Array, key: Array, value: Array, bias: Array | None = None,
    mask: Array | None = None, *, g: Array, beta: Array, scale: float | None = None,
    is_causal: bool = True, chunk_size: int = 16, qk_l2norm: bool = True,
    segment_ids: Array | None = None, initial_state: Array | None = None,
    return_final_state: bool = False, query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None, head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Any:
    """Kimi Delta Attention: Gated DeltaNet with one log-decay per key dimension.

    S' = Diag(e^{g_t}) S_{t−1}, then the delta rule, as fla's ``chunk_kda(q, k, v, g, beta,
    scale)``; the same chunked code as :func:`gated_deltanet_attention`, with C × C × d_k
    decayed products inside each chunk (hence the smaller default chunk).

    Args:
      g: float ``(batch..., n, H_v, d_k)`` log-decays ≤ 0.
      beta, the rest: as :func:`gated_deltanet_attention`.

    References:
      Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture", eq. 1
      (fine-grained gating of the gated delta rule).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import kda_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 100, 4, 16))
      >>> kda_attention(q, k, v, g=jnp.full((1, 100, 4, 16), -0.05),
      ...               beta=jnp.full((1, 100, 4), 0.5), qk_l2norm=True).shape
      (2, 100, 4, 16)
    """
    method = "kda_attention"
    arguments = dict(locals())
    g, beta = _inputs(method, query, key, value, bias, mask, is_causal,
                      flax_kwargs, g, beta, (key.shape[-1],))
    return _family.run(method, query, key, value, mask, g=g, beta=beta, qk_l2norm=qk_l2norm,
                       flax_kwargs=flax_kwargs, **_family.passed(arguments))
