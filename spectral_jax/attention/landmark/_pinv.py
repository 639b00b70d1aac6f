"""The iterative Moore-Penrose pseudo-inverse of Nyströmformer, spectral shifting and
Skyformer."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError, _checks

Array = jax.Array

PINV_INITS = ("per_matrix", "global")


def iterative_pinv(
    matrix: Array, num_iterations: int | None = 6, init: str = "per_matrix", *,
    norm: Array | None = None,
) -> Array:
    """Approximates the pseudo-inverse of square matrices by a third-order Newton–Schulz iteration.

    Z_{j+1} = ¼ Z_j (13I − A Z_j (15I − A Z_j (7I − A Z_j))), with Z_0 = Aᵀ / (‖A‖₁‖A‖∞).
    Each step maps the eigenvalues e of I − A Z to e³(3 + e)/4, so directions whose scaled
    squared singular value is tiny are inverted only after many steps: a few steps act as a
    smooth regularised inverse, which is what Nyströmformer relies on (do not replace it by an
    exact pinv for speed or "accuracy": on ill-conditioned landmark matrices it is worse).

    Args:
      matrix: float ``(..., m, m)``: one matrix or a stack of them.
      num_iterations: number of steps (Nyströmformer uses 6). ``None`` computes the exact
        ``jnp.linalg.pinv`` instead (a test and analysis option; O(m³) SVD).
      init: ``"per_matrix"`` scales each matrix's Z_0 by its own norms (batch-independent);
        ``"global"`` uses one scale for the whole stack, the largest column sum of any matrix
        times the largest row sum of any matrix (see :func:`pinv_norm`), as the PyTorch
        reference implementations do over their (batch, heads, m, m) tensor (then an
        example's output depends on the rest of its batch).
      norm: optional precomputed scale ‖A‖₁‖A‖∞, broadcastable to ``matrix.shape[:-2]``;
        overrides ``init``. The attention functions compute the ``"global"`` scale over
        all their examples and heads first and pass it here to per-head code.

    Returns:
      float ``(..., m, m)``, same dtype as ``matrix``.

    Raises:
      spectral_jax.UsageError: for a non-square matrix, negative iterations or an unknown ``init``.

    References:
      Razavi et al. 2014, "A new iterative method for finding approximate inverses of complete
      symmetric positive definite matrices", eq. (24); Xiong et al. 2021, Nyströmformer, §3.3.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import iterative_pinv
      >>> a = jnp.array([[2.0, 0.0], [0.0, 4.0]])
      >>> [round(float(x), 4) for x in jnp.diag(iterative_pinv(a, 8))]
      [0.5, 0.25]
    """
    method = "iterative_pinv"
    if matrix.ndim < 2 or matrix.shape[-2] != matrix.shape[-1]:
        raise UsageError(
            f"{method}(): `matrix` must be square (..., m, m); got shape {matrix.shape}.")
    _checks.choice(f"{method}()", "init", init, PINV_INITS)
    _checks.reject_traced(f"{method}()", "num_iterations", num_iterations)
    if num_iterations is None:
        return jnp.linalg.pinv(matrix, hermitian=False)
    if (isinstance(num_iterations, bool) or not isinstance(num_iterations, (int, np.integer))
            or num_iterations < 0):
        raise UsageError(
            f"{method}(): `num_iterations` must be a non-negative int or None; got "
            f"{num_iterations!r}."
        )
    if norm is None:
        norm = pinv_norm(matrix, init)
    norm = jnp.asarray(norm)[..., None, None]
    z = jnp.swapaxes(matrix, -1, -2) / jnp.where(norm > 0, norm, 1.0)
    eye = jnp.eye(matrix.shape[-1], dtype=matrix.dtype)

    def step(_: Any, z: Array) -> Array:
        az = matrix @ z
        return 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))

    # A loop, not a Python loop: one step in the program whatever the count, so every
    # Nyström-family method compiles the pseudo-inverse once (a static count: a scan,
    # differentiable in reverse mode).
    return jax.lax.fori_loop(0, int(num_iterations), step, z)


def pinv_norm(matrix: Array, init: str = "per_matrix") -> Array:
    """The Z_0 scale ‖A‖₁‖A‖∞ of :func:`iterative_pinv` for float ``(..., m, m)`` matrices.

    ``"per_matrix"``: each matrix's largest absolute column sum times its largest absolute
    row sum, shape ``matrix.shape[:-2]``. ``"global"``: the largest column sum over the whole
    stack times the largest row sum over the whole stack, a scalar (two independent maxima,
    as the Nyströmformer reference code takes ``max`` of each sum over its whole tensor).
    Both are differentiable, with the gradient of ``max`` going to the maximising entries.
    """
    _checks.choice("pinv_norm()", "init", init, PINV_INITS)
    abs_a = jnp.abs(matrix)
    columns, rows = abs_a.sum(axis=-2), abs_a.sum(axis=-1)
    if init == "global":
        return columns.max() * rows.max()
    return columns.max(axis=-1) * rows.max(axis=-1)
