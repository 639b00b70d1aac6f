"""Float64 NumPy formulas, one head: clustered, ProbSparse, memory-compressed, local."""

from __future__ import annotations

import math

import numpy as np
from numpy_reference import attention, softmax


def kmeans(q, clusters, iterations):
    n = len(q)
    start = ((np.arange(clusters) * 2 + 1) * n) // (2 * clusters)
    c = q[start].copy()
    assign = lambda c: np.argmin(((q[:, None] - c[None]) ** 2).sum(-1), -1)  # noqa: E731
    for _ in range(iterations):
        a = assign(c)
        for j in range(clusters):
            if (a == j).any():
                c[j] = q[a == j].mean(0)
    a = assign(c)
    return np.stack([q[a == j].mean(0) if (a == j).any() else np.zeros(q.shape[1])
                     for j in range(clusters)]), a


def clustered(q, k, v, clusters, iterations, topk=None, *, scale):
    cent, a = kmeans(q, clusters, iterations)
    logits = scale * cent @ k.T
    w = softmax(logits)
    if topk is None:
        return (w @ v)[a]
    out = np.zeros((len(q), v.shape[1]))
    for i in range(len(q)):
        top = np.argsort(-logits[a[i]])[:topk]
        mass = w[a[i], top].sum()
        rest = w[a[i]].copy()
        rest[top] = 0
        out[i] = mass * softmax(scale * q[i] @ k[top].T) @ v[top] + rest @ v
    return out


def probsparse(q, k, v, factor, *, scale):
    n = len(q)
    u = max(1, min(factor * math.ceil(math.log(n)), n))
    pos = ((np.arange(u) * 2 + 1) * n) // (2 * u)
    s = scale * q @ k[pos].T
    m = s.max(-1) - s.mean(-1)
    top = np.argsort(-m, kind="stable")[:u]
    out = np.broadcast_to(v.mean(0), (n, v.shape[1])).copy()
    out[top] = attention(q[top], k, v, scale)
    return out


def memory_compressed(q, k, v, wk, wv, stride, causal, *, scale):
    n, kernel = len(k), wk.shape[0]
    slots = -(-n // stride)
    pad = lambda x: np.concatenate([x, np.zeros((slots * stride + kernel, x.shape[1]))])  # noqa
    kp, vp = pad(k), pad(v)
    km = np.stack([sum(kp[j * stride + t] @ wk[t] for t in range(kernel)) for j in range(slots)])
    vm = np.stack([sum(vp[j * stride + t] @ wv[t] for t in range(kernel)) for j in range(slots)])
    allowed = np.ones((n, slots), bool)
    if causal:
        last = np.minimum(np.arange(slots) * stride + kernel - 1, n - 1)
        allowed = last[None] <= np.arange(n)[:, None]
    return softmax(scale * q @ km.T, allowed) @ vm


def band(q, k, v, window, causal, *, scale):
    i = np.arange(len(q))
    allowed = np.abs(i[:, None] - i[None]) <= window
    if causal:
        allowed &= i[:, None] >= i[None]
    return softmax(scale * q @ k.T, allowed) @ v
