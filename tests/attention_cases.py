"""Shared inputs for the attention tests: per-method parameters and random token regimes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import ATTENTIONS

NAMES = tuple(ATTENTIONS)
APPROXIMATE = tuple(n for n, s in ATTENTIONS.items() if not s.exact)
CAUSAL = tuple(n for n, s in ATTENTIONS.items() if s.supports_causal)
NON_CAUSAL = tuple(n for n, s in ATTENTIONS.items() if not s.supports_causal)
# The linear-recurrent family keeps one state per value head with its own decay: grouped
# heads there are the family's own form (tests/test_recurrent_*.py), not repeated keys.
RECURRENT = tuple(n for n in NAMES if ".recurrent." in ATTENTIONS[n].fn.__module__)
# The methods whose grouped heads equal keys and values repeated to the query heads.
GROUPED = tuple(n for n in NAMES if n not in RECURRENT)


def method_kwargs(name: str, *, n: int, head_dim: int, seed: int = 0, budget: int | None = None):
    """The method parameters a caller must supply, at a small budget that still approximates.

    The budget (``spec.test_budget`` unless given) and the state come from the registry.
    """
    spec = ATTENTIONS[name]
    return spec.call_kwargs(jax.random.key(1000 + seed), budget=budget or spec.test_budget,
                            length=n, head_dim=head_dim)


@functools.cache
def jitted(fn, **static):
    """``fn`` with its non-array keywords bound, jitted once per keyword set.

    Arrays passed at the call (query, key, value, masks, lengths) are traced, so one compiled
    program serves every test and seed that calls ``fn`` at one shape: compiling dominates
    the tests' time, running the small programs costs next to nothing.
    """
    return jax.jit(functools.partial(fn, **static))


def random_walk(key, shape, step: float = 0.3):
    """Locally correlated tokens (b, n, h, d): what segment-means landmarks assume."""
    return jnp.cumsum(step * jax.random.normal(key, shape), axis=-3)


def qkv(seed: int = 0, shape=(2, 48, 2, 8), dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (
        random_walk(k1, shape).astype(dtype),
        random_walk(k2, shape).astype(dtype),
        jax.random.normal(k3, shape, dtype),
    )


def qkv64(seed: int = 0, shape=(1, 64, 1, 8), step: float = 0.3):
    """Float64 (query, key, value): random-walk queries and keys, Gaussian values (x64 on)."""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (random_walk(k1, shape, step).astype(jnp.float64),
            random_walk(k2, shape, step).astype(jnp.float64),
            jax.random.normal(k3, shape, jnp.float64))


def one_head(x) -> np.ndarray:
    """The first example's first head of ``(batch, n, heads, d)`` as a float64 ``(n, d)``."""
    return np.asarray(x, np.float64)[0, :, 0, :]


def padding_mask(valid: jax.Array) -> jax.Array:
    """(b, n) bool -> (b, 1, n, n) padding mask, as flax.nnx.make_attention_mask builds it."""
    return valid[:, None, :, None] & valid[:, None, None, :]


def rel_err(approx, exact) -> float:
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
