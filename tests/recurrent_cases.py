"""Inputs and an independent float64 numpy reference for the linear-recurrent family's tests.

:func:`numpy_recurrence` steps each state head through its tokens in plain numpy, from the
methods' published recurrences, with the head mapping, padding and segment resets written
out loop by loop: it shares no code with the library.
"""

from __future__ import annotations

import numpy as np

from spectral_jax.attention import recurrent as rec

FUNCTIONS = {
    "gla": rec.gla_attention,
    "simple_gla": rec.simple_gla_attention,
    "retnet": rec.retnet_attention,
    "mamba2": rec.mamba2_attention,
    "deltanet": rec.deltanet_attention,
    "gated_deltanet": rec.gated_deltanet_attention,
    "kda": rec.kda_attention,
}
DELTA = ("deltanet", "gated_deltanet", "kda")


def inputs(method: str, seed: int = 0, *, batch: int = 2, n: int = 37, heads=(2, 2, 2),
           d_k: int = 6, d_v: int = 5, decay=(0.7, 1.0)):
    """float64 numpy ``(q, k, v, kwargs)`` for ``method`` with ``heads = (H_q, H_k, H_v)``;
    log-decays from ``log U(decay)``, β ~ U(0, 1)."""
    rng = np.random.default_rng(seed)
    h_q, h_k, h_v = heads
    q = rng.normal(size=(batch, n, h_q, d_k))
    k = rng.normal(size=(batch, n, h_k, d_k))
    v = rng.normal(size=(batch, n, h_v, d_v))
    log_decay = lambda *shape: np.log(rng.uniform(*decay, size=shape))  # noqa: E731
    kw: dict = {}
    if method == "gla":
        kw["g"] = log_decay(batch, n, h_v, d_k)
    elif method in ("simple_gla", "gated_deltanet"):
        kw["g"] = log_decay(batch, n, h_v)
    elif method == "kda":
        kw["g"] = log_decay(batch, n, h_v, d_k)
    elif method == "mamba2":
        kw.update(dt=rng.normal(size=(batch, n, h_v)), A=-rng.uniform(0.5, 2.0, size=h_v),
                  D=rng.normal(size=h_v), dt_bias=rng.normal(size=h_v), dt_softplus=True)
    if method in DELTA:
        kw["beta"] = rng.uniform(0, 1, size=(batch, n, h_v))
        kw["qk_l2norm"] = True  # the default, passed explicitly
    return q, k, v, kw


def _per_token(method: str, q, k, v, kw):
    """The recurrence's own terms: (q, k, v, g (B, n, H_v, K), beta or None, scale, skip)."""
    b, n, h_v, d_v = v.shape
    d_k = k.shape[-1]
    scale = 1.0 / np.sqrt(d_k)
    beta, skip = kw.get("beta"), None
    if kw.get("qk_l2norm"):
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if method in ("gla", "kda"):
        g = np.broadcast_to(kw["g"], (b, n, h_v, d_k))
    elif method in ("simple_gla", "gated_deltanet"):
        g = np.broadcast_to(kw["g"], (b, n, h_v))[..., None]
    elif method == "retnet":
        g = np.broadcast_to(np.log(1 - 2.0 ** (-5.0 - np.arange(h_v)))[:, None], (b, n, h_v, 1))
    elif method == "mamba2":
        dt = kw["dt"] + kw["dt_bias"]
        dt = np.where(dt > 20, dt, np.log1p(np.exp(dt)))
        g = (dt * kw["A"])[..., None]
        skip = kw["D"][:, None] * v
        v = v * dt[..., None]
        scale = 1.0
    else:
        g = np.zeros((b, n, h_v, 1))
    return q, k, v, g, beta, scale, skip


def numpy_recurrence(method: str, q, k, v, kw, *, valid=None, segment_ids=None):
    """float64 ``(B, n, max(H_q, H_v), d_v)``: the method's recurrence token by token.

    ``valid`` bool ``(B, n)``: padded tokens neither write nor decay, their outputs are 0;
    ``segment_ids`` int ``(B, n)``: the state is dropped where the id changes.
    """
    q, k, v, g, beta, scale, skip = _per_token(method, *(np.asarray(x, np.float64)
                                                         for x in (q, k, v)), kw)
    b, n, h_q, _ = q.shape
    h_k, h_v, d_v = k.shape[2], v.shape[2], v.shape[3]
    h_out = max(h_q, h_v)
    valid = np.ones((b, n), bool) if valid is None else np.asarray(valid)
    out = np.zeros((b, n, h_out, d_v))
    for e in range(b):
        for o in range(h_out):
            s_head = o // (h_q // h_v) if h_q >= h_v else o
            q_head = o if h_q >= h_v else o // (h_v // h_q)
            k_head = s_head // (h_v // h_k)
            state = np.zeros((k.shape[-1], d_v))
            for t in range(n):
                if segment_ids is not None and t > 0 and segment_ids[e, t] != segment_ids[e, t - 1]:
                    state = np.zeros_like(state)
                if not valid[e, t]:
                    continue
                kt, vt = k[e, t, k_head], v[e, t, s_head]
                state = np.exp(g[e, t, s_head])[:, None] * state
                if beta is None:
                    state = state + np.outer(kt, vt)
                else:
                    state = state + beta[e, t, s_head] * np.outer(kt, vt - kt @ state)
                out[e, t, o] = scale * q[e, t, q_head] @ state
                if skip is not None:
                    out[e, t, o] += skip[e, t, s_head]
    return out
