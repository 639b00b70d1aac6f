"""Independent float64 numpy implementations of each method's formula, for the tests."""

from __future__ import annotations

import numpy as np


def softmax(x, valid=None):
    x = np.asarray(x, np.float64)
    if valid is not None:
        x = np.where(valid, x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def attention(q, k, v, scale, key_valid=None, causal=False):
    """One head: (n, d) arrays."""
    logits = scale * q @ k.T
    valid = (
        np.ones(logits.shape, bool)
        if key_valid is None
        else np.broadcast_to(key_valid, logits.shape)
    )
    if causal:
        valid = valid & np.tril(np.ones(logits.shape, bool))
    return softmax(logits, valid) @ v


def pinv_iteration(a, iterations):
    a = np.asarray(a, np.float64)
    z = a.T / (np.abs(a).sum(0).max() * np.abs(a).sum(1).max())
    eye = np.eye(a.shape[0])
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_means(x, valid, m):
    idx = np.flatnonzero(valid)
    seg = (np.arange(len(idx)) * m) // len(idx)
    out = np.zeros((m, x.shape[1]))
    ok = np.zeros(m, bool)
    for j in range(m):
        members = idx[seg == j]
        if len(members):
            out[j] = x[members].mean(0)
            ok[j] = True
    return out, ok


def nystrom_kernels(q, k, scale, m, valid):
    q = q * scale
    ql, qok = segment_means(q, valid, m)
    kl, kok = segment_means(k, valid, m)
    f = softmax(q @ kl.T, kok[None])
    a = softmax(ql @ kl.T, kok[None]) * qok[:, None]
    b = softmax(ql @ k.T, valid[None]) * qok[:, None]
    return f, a, b


def gaussian_kernel(x, y):
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d2)


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


def linear_attention(q, k, v, causal=False, eps=1e-6):
    pq, pk = elu1(q), elu1(k)
    w = pq @ pk.T
    if causal:
        w = np.tril(w)
    return (w @ v) / (w.sum(-1, keepdims=True) + eps)
