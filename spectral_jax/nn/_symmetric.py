"""Symmetric attention's pairwise variants: scores Q·Σ_h·Qᵀ/√d with a learned Σ_h per head."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError

Array = jax.Array

SYMMETRIC = (False, True, "pairwise", "pairwise_psd")


def check_symmetric(value: Any) -> bool | str:
    """The ``symmetric`` module option, checked (``"true"``/``"false"`` from a CLI allowed)."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if not any(value is s or (isinstance(s, str) and value == s) for s in SYMMETRIC):
        raise UsageError(
            f"attention_kwargs['symmetric'] must be one of {list(SYMMETRIC)}, got {value!r}."
        )
    return value


class PairwiseScores(nnx.Module):
    """A learned d×d matrix per head that turns shared projections into Q·Σ_h·Qᵀ scores.

    Courtois et al. 2024 ("Symmetric Dot-Product Attention for Efficient Training of BERT
    Language Models", Findings of ACL), pairwise variant: with the shared projection
    Q = X·W_q, the scores are q_i·Σ_h·q_jᵀ/√d. Two forms:

    - ``psd=False`` (``symmetric="pairwise"``): Σ_h unconstrained, drawn N(0, 1/d) (the
      reference draws it from a normal and leaves it free). The attention function gets
      query = Q and key = Q·Σ_hᵀ, so that query_i·key_j = q_iᵀ·Σ_h·q_j.
    - ``psd=True`` (``symmetric="pairwise_psd"``): Σ_h = L_h·L_hᵀ, L_h drawn N(0, 1/d), so
      Σ_h is symmetric positive semi-definite and the kernel exp(Q Σ Qᵀ/√d) stays SPSD (what
      the landmark and symmetric spectral-shift methods assume). The attention function gets
      query = key = Q·L_h.

    Parameters: ``matrix`` ``(heads, head_dim, head_dim)`` (Σ or L), ``heads·head_dim²``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> scores = PairwiseScores(2, 4, psd=True, rngs=nnx.Rngs(0))
        >>> q, k = scores(jnp.ones((1, 3, 2, 4)), jnp.ones((1, 3, 2, 4)))
        >>> bool(jnp.array_equal(q, k)), q.shape
        (True, (1, 3, 2, 4))
    """

    def __init__(self, num_heads: int, head_dim: int, *, psd: bool,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs) -> None:
        self.psd = psd
        init = nnx.initializers.normal(head_dim**-0.5)
        self.matrix = nnx.Param(init(rngs.params(), (num_heads, head_dim, head_dim),
                                     param_dtype))

    def sigma(self) -> Array:
        """Σ_h ``(heads, head_dim, head_dim)``."""
        m = self.matrix[...]
        return m @ jnp.swapaxes(m, -1, -2) if self.psd else m

    def __call__(self, query: Array, key: Array) -> tuple[Array, Array]:
        """(query, key) ``(batch..., n, heads, head_dim)`` of the shared projection, mapped."""
        m = self.matrix[...].astype(query.dtype)
        if self.psd:  # q L, k L: (q L)·(k L) = q L Lᵀ kᵀ
            return (jnp.einsum("...hd,hde->...he", query, m),
                    jnp.einsum("...hd,hde->...he", key, m))
        # key_j[e] = Σ_d Σ[e, d] k_j[d], so that query_i·key_j = q_iᵀ Σ k_j.
        return query, jnp.einsum("...hd,hed->...he", key, m)
