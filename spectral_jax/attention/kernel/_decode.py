"""Decode forms with an O(1) state: running φ(K)ᵀV and Σφ(K) (linear, Performer, RFA-Gate).

Per head the state is S = Σ_j w_j φ(k_j) v_jᵀ ``(r, d_v)`` and z = Σ_j w_j φ(k_j) ``(r,)``
in float32, and the output is φ(q)ᵀS / (φ(q)ᵀz + eps) (Katharopoulos et al. 2020, eq. 18-20:
the recurrent form of causal linear attention). Weights: w_j = 1 (linear, Performer);
RFA-Gate's S_t = g_t S_{t−1} + (1 − g_t) φ(k_t)v_tᵀ (Peng et al. 2021, §3.2).

Performer's key features exp(ωᵀk̂ − ‖k̂‖²/2 − m)/√r need a stabiliser m that the parallel
form takes over all keys. A decoder cannot see later keys, so the state keeps the running
maximum m and rescales S and z by exp(m_old − m_new) when it grows (as online softmax
does); the ratio is unchanged, so the outputs equal the parallel form's.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.core import _common
from spectral_jax.attention.core._decode_form import DecodeForm, choose, lift_prefill, lift_step
from spectral_jax.attention.kernel._linear import FEATURE_MAPS

Array = jax.Array


def _positive(den: Array) -> Array:
    # No key yet: 0/0; the zero is replaced so that values and gradients stay finite.
    return jnp.where(den > 0, den, 1.0)


def _read(phi_q: Array, state: Array, norm: Array, eps: float) -> Array:
    return (phi_q @ state) / _positive(phi_q @ norm + eps)


def _zeros(batch, heads, features, v_head_dim) -> dict[str, Array]:
    ct = jnp.float32
    return {"state": jnp.zeros((batch, heads, features, v_head_dim), ct),
            "norm": jnp.zeros((batch, heads, features), ct)}


def _written(k: Array, lengths: Array) -> Array:
    """bool ``(B, H, P)``: the prompt rows before each example's length."""
    valid = jnp.arange(k.shape[1])[None, :] < lengths[:, None]
    return jnp.broadcast_to(valid[:, None, :], (k.shape[0], k.shape[2], k.shape[1]))


def _heads(x: Array) -> Array:
    return jnp.swapaxes(x, 1, 2).astype(_common.compute_dtype(x.dtype))


# -- linear -----------------------------------------------------------------------------------

def _phi(params: dict[str, Any]):
    return FEATURE_MAPS[params["feature_map"]]


def _linear_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del max_length, dtype, params
    return _zeros(batch, heads, head_dim, v_head_dim)


def _linear_prefill(q, k, v, lengths, max_length, params):
    del q, max_length
    phi = _phi(params)
    written = _written(k, lengths)
    fk = jnp.where(written[..., None], phi(_heads(k)), 0.0)  # (B, H, P, r)
    vv = jnp.where(written[..., None], _heads(v), 0.0)
    return {"state": jnp.einsum("bhpr,bhpe->bhre", fk, vv), "norm": fk.sum(2)}


def _linear_step(arrays, position, write, q, k, v, params):
    phi, eps = _phi(params), params["eps"]

    def core(s, pos, write1, q1, k1, v1, _):
        del pos
        ct = _common.compute_dtype(q1.dtype)
        fk = phi(k1.astype(ct))
        state = s["state"] + jnp.outer(fk, v1.astype(ct))
        norm = s["norm"] + fk
        new = {"state": state, "norm": norm}
        return _read(phi(q1.astype(ct)), state, norm, eps), choose(write1, new, s)

    return lift_step(core, arrays, position, write, q, k, v, {})


FEATURE_STATE = DecodeForm(
    init=_linear_init, prefill=_linear_prefill, step=_linear_step,
    summary="the running sums φ(K)ᵀV (d×d_v) and Σφ(K) (d): O(d·d_v) per head, whatever the "
            "context length",
    grouped=True)


# -- performer --------------------------------------------------------------------------------

def _performer_logits(rows: Array, projection: Array, scale: Any) -> Array:
    """ωᵀx̂ − ‖x̂‖²/2 with x̂ = x·scale^{1/2}, as in ``performer_attention``."""
    ct = _common.compute_dtype(rows.dtype)
    x = rows.astype(ct) * scale**0.5
    return x @ projection.astype(ct).T - 0.5 * jnp.sum(x * x, -1, keepdims=True)


def _performer_scale(params: dict[str, Any], head_dim: int) -> Any:
    return _common.default_scale("decode_step", params.get("scale"), head_dim)


def _performer_init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    del max_length, dtype
    r = params["projection"].shape[0]
    return {**_zeros(batch, heads, r, v_head_dim),
            "stabiliser": jnp.full((batch, heads), -jnp.inf, jnp.float32)}


def _performer_prefill(q, k, v, lengths, max_length, params):
    del q, max_length
    w, scale = params["projection"], _performer_scale(params, k.shape[-1])
    inv_sqrt_r = 1.0 / math.sqrt(w.shape[0])

    def core(kh, vh, valid):
        logits = _performer_logits(kh, w, scale)  # (P, r)
        m = jnp.max(jnp.where(valid[:, None], logits, -jnp.inf))
        safe = jnp.where(jnp.isfinite(m), m, 0.0)
        fk = jnp.where(valid[:, None], jnp.exp(logits - safe) * inv_sqrt_r, 0.0)
        vh = jnp.where(valid[:, None], vh.astype(fk.dtype), 0.0)
        return {"state": fk.T @ vh, "norm": fk.sum(0), "stabiliser": m}

    written = _written(k, lengths)
    return lift_prefill(core, (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), written))


def _performer_step(arrays, position, write, q, k, v, params):
    w, scale = params["projection"], _performer_scale(params, q.shape[-1])
    inv_sqrt_r = 1.0 / math.sqrt(w.shape[0])

    def core(s, pos, write1, q1, k1, v1, _):
        del pos
        k_logits = _performer_logits(k1[None], w, scale)[0]
        m = jnp.maximum(s["stabiliser"], k_logits.max())
        # exp(m_old − m_new) ≤ 1 rescales what was summed under the old stabiliser; an empty
        # state (m_old = −inf) has nothing to rescale.
        decay = jnp.where(jnp.isfinite(s["stabiliser"]), jnp.exp(s["stabiliser"] - m), 0.0)
        fk = jnp.exp(k_logits - m) * inv_sqrt_r
        state = decay * s["state"] + jnp.outer(fk, v1.astype(fk.dtype))
        norm = decay * s["norm"] + fk
        q_logits = _performer_logits(q1[None], w, scale)[0]
        fq = jnp.exp(q_logits - jax.lax.stop_gradient(q_logits.max())) * inv_sqrt_r
        new = {"state": state, "norm": norm, "stabiliser": m}
        return _read(fq, state, norm, 0.0), choose(write1, new, s)

    return lift_step(core, arrays, position, write, q, k, v, {})


RANDOM_FEATURE_STATE = DecodeForm(
    init=_performer_init, prefill=_performer_prefill, step=_performer_step,
    summary="the running sums φ(K)ᵀV (r×d_v) and Σφ(K) (r) of positive random features and "
            "their running stabiliser: O(r·d_v) per head, whatever the context length",
    grouped=True)


# -- gated_linear ------------------------------------------------------------------------------

def _gates(gates: Array, shape: tuple[int, ...]) -> Array:
    """``(B, n, H)`` gates (batch and heads may be 1), as ``gated_linear_attention`` takes them."""
    return jnp.broadcast_to(gates, shape).astype(jnp.float32)


def _gated_prefill(q, k, v, lengths, max_length, params):
    del q, max_length
    phi = _phi(params)
    b, p, h = k.shape[:3]
    # A padded position neither writes nor forgets (gate 1), as in the parallel form.
    gates = jnp.swapaxes(_gates(params["gates"], (b, p, h)), 1, 2)  # (B, H, P)
    written = _written(k, lengths)
    gates = jnp.where(written, gates, 1.0)

    def core(kh, vh, gh):
        ct = _common.compute_dtype(kh.dtype)

        def one(carry, token):
            state, norm = carry
            k1, v1, g = token
            fk = phi(k1.astype(ct))
            return (g * state + (1 - g) * jnp.outer(fk, v1.astype(ct)),
                    g * norm + (1 - g) * fk), None

        init = (jnp.zeros((kh.shape[-1], vh.shape[-1]), ct), jnp.zeros((kh.shape[-1],), ct))
        (state, norm), _ = jax.lax.scan(one, init, (kh, vh, gh))
        return {"state": state, "norm": norm}

    return lift_prefill(core, (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), gates))


def _gated_step(arrays, position, write, q, k, v, params):
    phi, eps = _phi(params), params["eps"]
    b, h = k.shape[:2]  # the state's heads: the key/value heads
    gates = _gates(params["gates"], (b, 1, h))[:, 0]  # (B, H_kv)

    def core(s, pos, write1, q1, k1, v1, g):
        del pos
        ct = _common.compute_dtype(q1.dtype)
        fk = phi(k1.astype(ct))
        state = g * s["state"] + (1 - g) * jnp.outer(fk, v1.astype(ct))
        norm = g * s["norm"] + (1 - g) * fk
        new = {"state": state, "norm": norm}
        return _read(phi(q1.astype(ct)), state, norm, eps), choose(write1, new, s)

    return lift_step(core, arrays, position, write, q, k, v, gates)


GATED_STATE = DecodeForm(
    init=_linear_init, prefill=_gated_prefill, step=_gated_step,
    summary="the gated running sums S (d×d_v) and z (d), decayed by each token's gate: "
            "O(d·d_v) per head, whatever the context length",
    grouped=True)
