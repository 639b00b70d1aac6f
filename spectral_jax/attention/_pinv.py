"""The iterative Moore-Penrose pseudo-inverse used by Nyströmformer, spectral shifting, Skyformer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import _common

Array = jax.Array

PINV_INITS = ("per_matrix", "global")


def iterative_pinv(
    matrix: Array, num_iterations: int | None = 6, init: str = "per_matrix"
) -> Array:
    """Approximates the pseudo-inverse of a square matrix by a third-order Newton–Schulz iteration.

    Z_{j+1} = ¼ Z_j (13I − A Z_j (15I − A Z_j (7I − A Z_j))), with Z_0 = Aᵀ / (‖A‖₁‖A‖∞).
    Each step maps the eigenvalues e of I − A Z to e³(3 + e)/4, so directions whose scaled
    squared singular value is tiny are inverted only after many steps: a few steps act as a
    smooth regularised inverse, which is what Nyströmformer relies on (do not replace it by an
    exact pinv for speed or "accuracy": on ill-conditioned landmark matrices it is worse).

    Args:
      matrix: float ``(m, m)`` (one head; vmap for more).
      num_iterations: number of steps (Nyströmformer uses 6). ``None`` computes the exact
        ``jnp.linalg.pinv`` instead (a test and analysis option; O(m³) SVD).
      init: ``"per_matrix"`` scales Z_0 by this matrix's own norms (batch-independent);
        ``"global"`` uses the largest ‖A‖₁‖A‖∞ over the ``"batch"`` and ``"heads"`` vmap axes
        of the enclosing attention call, as the PyTorch reference implementations do (then an
        example's output depends on the rest of its batch).

    Returns:
      float ``(m, m)``, same dtype as ``matrix``.

    Raises:
      ValueError: for a non-square matrix, negative iterations or an unknown ``init``.

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
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{method}(): `matrix` must be square (m, m); got shape {matrix.shape}.")
    _common.check_choice(method, "init", init, PINV_INITS)
    if num_iterations is None:
        return jnp.linalg.pinv(matrix, hermitian=False)
    if (isinstance(num_iterations, bool) or not isinstance(num_iterations, (int, np.integer))
            or num_iterations < 0):
        raise ValueError(
            f"{method}(): `num_iterations` must be a non-negative int or None; got {num_iterations!r}."
        )
    abs_a = jnp.abs(matrix)
    norm = abs_a.sum(axis=0).max() * abs_a.sum(axis=1).max()
    if init == "global":
        norm = jax.lax.pmax(norm, ("batch", "heads"))
    z = matrix.T / jnp.where(norm > 0, norm, 1.0)
    eye = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
    for _ in range(int(num_iterations)):
        az = matrix @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z
