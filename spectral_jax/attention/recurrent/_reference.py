"""The linear-recurrent family's ground truth: the papers' recurrences, token by token.

:func:`recurrent_reference` steps one state head through the sequence with ``lax.scan``, in
whatever dtype it is given (float64 under ``jax.enable_x64`` for the tests). It is also the
"scan over tokens" that ``spectral-jax bench`` times the chunked form against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def token_step(state: Array, q: Array, k: Array, v: Array, g: Array, beta: Array | None,
               scale: float) -> tuple[Array, Array]:
    """One token of the recurrence for one state head.

    Args:
      state: ``(d_k, d_v)`` S_{t−1}.
      q: ``(G, d_k)`` the query heads reading this state; k ``(d_k,)``; v ``(d_v,)``.
      g: ``(K,)`` log-decay (K = 1 or d_k); beta: scalar write strength, or None for the
        additive update.
      scale: s.

    Returns:
      ``(o, S_t)``: o ``(G, d_v)`` = S_tᵀ(s·q) per query head.
    """
    state = jnp.exp(g)[:, None] * state
    if beta is None:
        state = state + jnp.outer(k, v)
    else:
        state = state + beta * jnp.outer(k, v - k @ state)
    return (scale * q) @ state, state


def recurrent_reference(q: Array, k: Array, v: Array, g: Array, beta: Array | None,
                        reset: Array, state: Array, *, scale: float) -> tuple[Array, Array]:
    """Outputs and final state of the recurrence over a whole sequence, one token a step.

    Args:
      q: ``(G, n, d_k)``; k ``(n, d_k)``; v ``(n, d_v)``; g ``(n, K)`` log-decays;
      beta: ``(n,)`` or None (additive); reset: bool ``(n,)``, True where the state is
        dropped before the token (a new packed segment); state: ``(d_k, d_v)`` S_0.
      scale: s.

    Returns:
      ``(out, final)``: out ``(G, n, d_v)``, final ``(d_k, d_v)``.

    References:
      GLA: Yang et al. 2024, arXiv:2312.06635, eq. 3. RetNet: Sun et al. 2023, eq. 1.
      Mamba-2 SSD: Dao & Gu 2024, arXiv:2405.21060, eq. 2 (v = Δx, g = ΔA, s = 1). DeltaNet:
      Schlag et al. 2021, eq. 29; Yang et al. 2024, arXiv:2406.06484, eq. 1. Gated
      DeltaNet: Yang et al. 2025, arXiv:2412.06464, eq. 10. KDA: Kimi Linear (2025), eq. 1.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention.recurrent import recurrent_reference
      >>> q = k = jnp.ones((1, 3, 1)); v = jnp.ones((3, 1)); g = jnp.log(jnp.full((3, 1), .5))
      >>> out, final = recurrent_reference(q, k[0], v, g, None, jnp.zeros(3, bool),
      ...                                  jnp.zeros((1, 1)), scale=1.0)
      >>> [float(x) for x in out[0, :, 0]]   # 1, 0.5·1 + 1, 0.5·1.5 + 1
      [1.0, 1.5, 1.75]
    """
    def step(s, token):
        q_t, k_t, v_t, g_t, b_t, r_t = token
        s = jnp.where(r_t, jnp.zeros_like(s), s)
        o, s = token_step(s, q_t, k_t, v_t, g_t, b_t, scale)
        return s, o

    tokens = (jnp.swapaxes(q, 0, 1), k, v, g, beta, reset)
    final, out = jax.lax.scan(step, state, tokens)
    return jnp.swapaxes(out, 0, 1), final
