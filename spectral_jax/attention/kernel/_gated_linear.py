"""Gated causal linear attention (RFA-Gate): S_t = g_t S_{t−1} + (1 − g_t) φ(k_t)v_tᵀ."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _common, _seq
from spectral_jax.attention.core._hints import cached_decode_hint
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.kernel._linear import FEATURE_MAPS

Array = jax.Array


def _positive(den: Array) -> Array:
    # A query with no valid key so far has 0/0; replacing the zero keeps values and grads finite.
    return jnp.where(den > 0, den, 1.0)


def gated_feature_attention(
    phi_q: Array, phi_k: Array, v: Array, gates: Array, *, chunk_size: int, eps: float
) -> Array:
    """y_t = φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + eps) for one head, by a chunked scan.

    With A_t the running sum of log g within a chunk, token j ≤ i of the same chunk reaches
    query i with weight exp(A_i − A_j)(1 − g_j) (a c × c lower-triangular product) and the
    carried state enters as exp(A_i)·S₀. Every exponent is ≤ 0, so nothing overflows, and
    the cost is O(n·c·(r + d_v) + n·r·d_v), never n × n.

    Args:
      phi_q: ``(n, r)`` non-negative query features; phi_k ``(n, r)`` (zero at padded keys);
        v ``(n, d_v)``; gates ``(n,)`` in [0, 1] (1 at padded keys).

    Returns:
      ``(n, d_v)``.
    """
    n, r = phi_q.shape
    c = min(chunk_size, n)
    pad = (-n) % c
    # g = 0 (a reset) is not summed as a log (log 0 = −inf, and a floor such as log tiny
    # ≈ −87 would round every later small log-gate at that magnitude): it is counted instead,
    # and a reset between j and i zeroes their weight (segments of the running reset count).
    reset = gates == 0
    log_g = jnp.log(jnp.where(reset, 1.0, gates))
    keep = 1.0 - gates
    pq, pk, pv = (jnp.pad(x, ((0, pad), (0, 0))) for x in (phi_q, phi_k, v))
    log_g, keep, reset = (jnp.pad(x, (0, pad)) for x in (log_g, keep, reset))
    nc = (n + pad) // c
    chunks = (pq.reshape(nc, c, r), pk.reshape(nc, c, r), pv.reshape(nc, c, -1),
              log_g.reshape(nc, c), keep.reshape(nc, c), reset.reshape(nc, c))
    tril = jnp.tril(jnp.ones((c, c), bool))

    def step(carry, chunk):
        state, norm = carry
        cq, ck, cv, clog, ckeep, creset = chunk
        a = jnp.cumsum(clog)
        # Resets at or before each position within the chunk: j reaches i only when no
        # reset lies in (j, i], i.e. both counts agree.
        seg = jnp.cumsum(creset.astype(jnp.int32))
        linked = tril & (seg[:, None] == seg[None, :])
        # Masked twice: the upper triangle's A_i − A_j > 0 could overflow, and an inf there
        # would give NaN gradients even though where() discards it.
        decay = jnp.where(linked, jnp.exp(jnp.where(linked, a[:, None] - a[None, :], 0.0)), 0.0)
        local = (cq @ ck.T) * decay * ckeep[None, :]
        carried = jnp.where(seg == 0, jnp.exp(a), 0.0)
        num = carried[:, None] * (cq @ state) + local @ cv
        den = carried * (cq @ norm) + local.sum(-1)
        weight = (jnp.where(seg == seg[-1], jnp.exp(a[-1] - a), 0.0) * ckeep)[:, None] * ck
        last = carried[-1]
        new = (last * state + weight.T @ cv, last * norm + weight.sum(0))
        return new, num / _positive(den + eps)[:, None]

    init = (jnp.zeros((r, v.shape[-1]), v.dtype), jnp.zeros((r,), v.dtype))
    if _seq.active() is not None:
        init = _shard_prefix_state(phi_k, v, log_g, keep, reset)
    _, out = jax.lax.scan(step, init, chunks)
    return out.reshape(nc * c, -1)[:n]


def _shard_prefix_state(
    phi_k: Array, v: Array, log_g: Array, keep: Array, reset: Array
) -> tuple[Array, Array]:
    """The state (S, z) entering this shard of a split sequence: the recurrence over every
    token of the shards before it.

    A shard maps an entering state S to D·S + S_shard, with D the product of its gates (0
    after a reset) and S_shard what its tokens write, decayed to its end. These affine maps
    compose associatively, so one all-gather of every shard's (D, S_shard, z_shard), 1 +
    r·(d_v + 1) numbers, and a fold over the shards before this one give the entering state
    (LASP-2's prefix, with gates).
    """
    a = jnp.cumsum(log_g)
    seg = jnp.cumsum(reset.astype(jnp.int32))
    # Token j reaches the shard's end decayed by exp(A_end − A_j), unless a reset follows it.
    weight = jnp.where(seg == seg[-1], jnp.exp(a[-1] - a), 0.0) * keep
    written = weight[:, None] * phi_k
    summary = (jnp.where(seg[-1] == 0, jnp.exp(a[-1]), 0.0), written.T @ v, written.sum(0))
    shard = _seq.active()
    every = jax.lax.all_gather(summary, shard.axis_name)
    index = jax.lax.axis_index(shard.axis_name)
    state = (jnp.zeros_like(summary[1]), jnp.zeros_like(summary[2]))
    for j in range(shard.num_shards):
        decay, s_j, z_j = (x[j] for x in every)
        before = j < index
        state = (jnp.where(before, decay * state[0] + s_j, state[0]),
                 jnp.where(before, decay * state[1] + z_j, state[1]))
    return state


def _gated_head(
    q: Array, k: Array, v: Array, q_valid: Array, k_valid: Array, gates: Array, *,
    feature_map: str, chunk_size: int, eps: float,
) -> Array:
    ct = _common.compute_dtype(q.dtype)
    phi = FEATURE_MAPS[feature_map]
    phi_q = phi(q.astype(ct))
    phi_k = jnp.where(k_valid[:, None], phi(k.astype(ct)), 0.0)
    v = jnp.where(k_valid[:, None], v.astype(ct), 0.0)
    # A padded position neither writes nor forgets: its gate is content too.
    gates = jnp.where(k_valid, gates.astype(ct), 1.0)
    out = gated_feature_attention(phi_q, phi_k, v, gates, chunk_size=chunk_size, eps=eps)
    return jnp.where(q_valid[:, None], out, 0.0)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    return len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


def _check_gates(method: str, gates: Any, key: Array) -> Array:
    expected = key.shape[:-1]
    # At least (length, heads): a gate per position, shared over the batch or the heads
    # when that axis is 1 (the registry's pure builder draws (length, 1)).
    if (not hasattr(gates, "shape") or gates.ndim < 2 or gates.shape[-2] != expected[-2]
            or not _broadcasts(tuple(gates.shape), expected)):
        raise UsageError(
            f"{method}(): `gates` must have shape (batch..., length, heads) = {expected} "
            f"(batch and heads may be 1); got {getattr(gates, 'shape', type(gates))}."
        )
    if not jnp.issubdtype(gates.dtype, jnp.floating):
        raise UsageTypeError(
            f"{method}(): `gates` must be a floating array; got dtype {gates.dtype}.")
    if not isinstance(gates, jax.core.Tracer):
        values = np.asarray(gates, np.float64)
        if values.size and not ((values >= 0) & (values <= 1)).all():
            bad = values[~((values >= 0) & (values <= 1))]
            raise UsageError(
                f"{method}(): `gates` must lie in [0, 1] (e.g. sigmoid outputs); got values "
                f"such as {bad[:3].tolist()}."
            )
    return jnp.broadcast_to(gates, expected)


@_common.drop_in_signature
def gated_linear_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    gates: Array,
    scale: float | None = None,
    is_causal: bool = True,
    feature_map: str = "elu",
    eps: float = 1e-6,
    chunk_size: int = 128,
    query_seq_lengths: Array | None = None,
    key_value_seq_lengths: Array | None = None,
    head_chunk_size: int | None = None,
    **flax_kwargs: Any,
) -> Array:
    """Causal linear attention with a gated, forgetting state (RFA-Gate), O(n·d·d_v).

    Per head, with φ = elu + 1 (or relu) and gates g_t ∈ [0, 1]:

        S_t = g_t·S_{t−1} + (1 − g_t)·φ(k_t) v_tᵀ,   z_t = g_t·z_{t−1} + (1 − g_t)·φ(k_t),
        y_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps),      S_0 = 0, z_0 = 0.

    Unrolled, y_t = Σ_{j≤t} w_tj φ(q_t)ᵀφ(k_j) v_j / (Σ_{j≤t} w_tj φ(q_t)ᵀφ(k_j) + eps) with
    w_tj = (1 − g_j)·Π_{j<s≤t} g_s: older tokens fade. A constant gate g cancels from the
    ratio except through ``eps``, so as g → 1 this tends to causal :func:`linear_attention`;
    g = 1 exactly writes nothing (all zeros). Keep ``eps`` well below (1 − g)·φ(q)ᵀφ(k),
    or 0. Computed by a chunked scan (see :func:`gated_feature_attention`); the recurrence
    is causal by construction, so ``is_causal`` must be True (the default). Padded keys
    neither write to the state nor decay it (their gate is taken as 1); padded queries give
    zero rows; a query with no valid key at or before it gives zeros.

    Args:
      query: float ``(batch..., n, heads, head_dim)``; bf16 in, bf16 out (float32 state).
      key: float ``(batch..., n, kv_heads, head_dim)``; ``kv_heads`` divides ``heads``
        (grouped-query attention: one state per key/value head, read by its query group).
      value: float ``(batch..., n, kv_heads, v_head_dim)``.
      bias: must be None.
      mask: optional bool padding mask broadcastable to ``(batch, heads, n, n)``.
      gates: float ``(batch..., n, kv_heads)`` in [0, 1], g_t per token and state (a module
        learns them as σ(x_t·w + b)); batch and heads axes may be 1 (shared); values
        checked when concrete.
      scale: must be None (the feature map replaces the softmax scale).
      is_causal: must be True.
      feature_map: ``"elu"`` (elu(x) + 1) or ``"relu"``.
      eps: added to the normaliser.
      chunk_size: tokens per chunk of the scan.

    Returns:
      ``(batch..., n, heads, v_head_dim)`` in ``query``'s dtype.

    Raises:
      spectral_jax.UsageError: bad shapes (q_len != kv_len, ``gates`` not ``(batch..., n, heads)``),
        gates outside [0, 1], ``bias`` or ``scale`` given, unknown ``feature_map``,
        non-positive ``chunk_size``, negative ``eps``, a mask that is not a padding mask.
      spectral_jax.UnsupportedError: ``is_causal=False`` (there is no bidirectional form), or
        one query against more keys under a mask: the call of Flax's
        ``MultiHeadAttention(decode=True)``, whose cache does not hold the gated state.
      spectral_jax.UsageTypeError: non-float inputs or gates, non-bool mask, unknown keywords.

    References:
      Peng et al. 2021, "Random Feature Attention", ICLR, §3.2 (RFA-Gate, the gated recurrence);
      Katharopoulos et al. 2020, "Transformers are RNNs", ICML (the feature map).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import gated_linear_attention
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 128, 4, 16))
      >>> g = jnp.full((2, 128, 4), 0.9)
      >>> gated_linear_attention(q, k, v, gates=g).shape
      (2, 128, 4, 16)
    """
    method = "gated_linear_attention"
    value, unfold = _common.fold_grouped_values(method, query, key, value)
    _common.check_call(method, query, key, value, bias, is_causal, flax_kwargs, mask=mask,
                       causal_ok=True)
    if not is_causal:
        raise UnsupportedError(
            f"{method}(): `is_causal=False` is not supported: the gated recurrence S_t = "
            "g_t S_(t-1) + (1 - g_t) phi(k_t) v_t^T only looks back, so it is causal by "
            "construction. Pass is_causal=True, or use linear_attention for bidirectional "
            "attention."
        )
    if query.shape[-3] != key.shape[-3]:
        raise UsageError(
            f"{method}(): the recurrence needs q_len == kv_len; got {query.shape[-3]} and "
            f"{key.shape[-3]} (a key/value cache, as Flax's decode mode passes, does not hold "
            "the gated state; spectral_jax.attention.decode_step and "
            "spectral_jax.nn.MultiHeadAttention(decode=True) carry it). "
            f"{cached_decode_hint()}"
        )
    gates = _check_gates(method, gates, key)
    _checks.choice(f"{method}()", "feature_map", feature_map, tuple(FEATURE_MAPS))
    _checks.positive_int(f"{method}()", "chunk_size", chunk_size)
    if scale is not None:
        raise UsageError(
            f"{method}(): `scale` must be None: linear attention has no logit scale; got {scale!r}."
        )
    p = prologue(method, query, key, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=is_causal)
    head = functools.partial(
        _gated_head, feature_map=feature_map, chunk_size=chunk_size,
        eps=_checks.number(f"{method}()", "eps", eps, low=0.0, what="a finite float >= 0"),
    )
    b = p.query_valid.shape[0]
    per_head_gates = jnp.swapaxes(gates.reshape(b, *gates.shape[-2:]), 1, 2)  # (B, H, n)
    return unfold(_common.lift(
        head, query, key, value, p.query_valid, p.key_valid, key_args=(per_head_gates,),
        method=method, mask_ok=p.mask_ok, head_chunk_size=head_chunk_size,
    ).astype(query.dtype))
