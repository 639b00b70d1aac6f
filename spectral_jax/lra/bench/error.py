"""`bench error`: how far each approximation is from the exact attention it targets."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError
from spectral_jax.attention import ATTENTIONS, get_attention_spec
from spectral_jax.lra.bench import inputs as inputs_lib
from spectral_jax.lra.bench import methods as methods_lib

Array = jax.Array

# Every approximation in the registry; each is compared with its registered exact target.
DEFAULT_METHODS = tuple(name for name, spec in ATTENTIONS.items() if not spec.exact)
METRICS = ("output", "frobenius", "spectral")
_TARGETS: dict[str, Callable[..., Array]] = {
    name: spec.fn for name, spec in ATTENTIONS.items() if spec.exact
}


@dataclasses.dataclass(frozen=True)
class QKV:
    """Fixed attention inputs, e.g. captured from a trained model (see ``bench dump-qkv``).

    Attributes:
      query, key, value: float ``(batch, n, heads, head_dim)``.
      mask: bool ``(batch, n)``, True at real (non-padding) tokens, or None.
      name: the regime name used in results, e.g. ``"checkpoint"``.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None = None
    name: str = "checkpoint"


def pairwise_mask(token_mask: Array | None) -> Array | None:
    """``(batch, 1, n, n)`` bool mask, True where both query and key are real tokens.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.lra.bench.error import pairwise_mask
      >>> pairwise_mask(jnp.array([[True, False]])).astype(int).tolist()
      [[[[1, 0], [0, 0]]]]
    """
    if token_mask is None:
        return None
    token_mask = jnp.asarray(token_mask, bool)
    return (token_mask[:, None, :, None] & token_mask[:, None, None, :])


def implicit_matrix(
    fn: Callable[..., Array], query: Array, key: Array, *args: Any, mask: Array | None = None
) -> Array:
    """The n×n matrix Ŝ an attention function applies to the values, Ŝ[b, h] with Ŝ V = out.

    Every method here is linear in the values, so passing V = I returns the matrix itself
    (fed ``head_dim`` columns at a time under ``vmap``), in O(n²) memory per head: use it for
    n up to a few thousand.

    Args:
      fn: ``fn(query, key, value, *args, mask=mask)``, e.g. from :func:`methods.bind`.
      query, key: ``(batch, n, heads, head_dim)``.
      *args: passed on to ``fn`` (the method's state).
      mask: optional mask passed on to ``fn``.

    Returns:
      float32 ``(batch, heads, n, n)``; row i holds the weights of query i over the keys.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.attention import softmax_attention
      >>> from spectral_jax.lra.bench.error import implicit_matrix
      >>> q = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))
      >>> s = implicit_matrix(lambda q, k, v, mask: softmax_attention(q, k, v), q, q)
      >>> bool(jnp.allclose(s.sum(-1), 1.0, atol=1e-5))
      True
    """
    batch, n, heads, dim = query.shape
    # V = I, fed head_dim columns at a time: some kernels (jax.nn.dot_product_attention)
    # require v_head_dim == head_dim.
    chunks = -(-n // dim)
    eye = jnp.eye(n, chunks * dim, dtype=query.dtype).reshape(n, chunks, dim)
    values = jnp.broadcast_to(
        jnp.moveaxis(eye, 1, 0)[:, None, :, None, :], (chunks, batch, n, heads, dim)
    )
    out = jax.vmap(lambda v: fn(query, key, v, *args, mask=mask))(values)
    # (chunks, batch, n_q, heads, dim) -> (batch, heads, n_q, n_k)
    out = jnp.transpose(out, (1, 3, 2, 0, 4)).reshape(batch, heads, n, chunks * dim)
    return out[..., :n].astype(jnp.float32)


def relative_output_error(approx: Any, exact: Any) -> float:
    """‖Ŷ − Y‖_F / ‖Y‖_F over the whole array, computed in float64.

    Raises:
      spectral_jax.UsageError: shapes differ, or ‖Y‖_F = 0 (the ratio is undefined).

    Example:
      >>> import numpy as np
      >>> from spectral_jax.lra.bench.error import relative_output_error
      >>> round(relative_output_error(np.array([3.0, 4.0]) * 1.1, np.array([3.0, 4.0])), 6)
      0.1
    """
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    if approx.shape != exact.shape:
        raise UsageError(f"`approx` shape {approx.shape} != `exact` shape {exact.shape}.")
    norm = np.linalg.norm(exact)
    if norm == 0:
        raise UsageError("`exact` is all zeros; a relative error is undefined.")
    return float(np.linalg.norm(approx - exact) / norm)


def relative_matrix_errors(approx: Any, exact: Any) -> tuple[float, float]:
    """Relative Frobenius and spectral-norm errors of ``(..., n, n)`` matrices, averaged.

    Each matrix contributes ‖Ŝ − S‖_F/‖S‖_F and ‖Ŝ − S‖_2/‖S‖_2 (float64, the spectral norm
    by SVD, O(n³)); the results are the means over the leading axes (batch, heads).

    Returns:
      ``(frobenius, spectral)``.

    Raises:
      spectral_jax.UsageError: shapes differ, or a matrix of ``exact`` is zero.

    Example:
      >>> import numpy as np
      >>> from spectral_jax.lra.bench.error import relative_matrix_errors
      >>> s = np.eye(3)[None]
      >>> [round(e, 6) for e in relative_matrix_errors(0.5 * s, s)]
      [0.5, 0.5]
    """
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    if approx.shape != exact.shape or exact.ndim < 2:
        raise UsageError(f"`approx` shape {approx.shape} != `exact` shape {exact.shape}.")
    diff = approx - exact
    axes = (-2, -1)
    fro_ref, spec_ref = np.linalg.norm(exact, "fro", axes), np.linalg.norm(exact, 2, axes)
    if (fro_ref == 0).any():
        raise UsageError("`exact` holds an all-zero matrix; a relative error is undefined.")
    fro = np.linalg.norm(diff, "fro", axes) / fro_ref
    spec = np.linalg.norm(diff, 2, axes) / spec_ref
    return float(fro.mean()), float(spec.mean())


def _jit_matrix(fn: Callable[..., Array]) -> Callable[..., Array]:
    return jax.jit(lambda query, key, *args, mask=None: implicit_matrix(
        fn, query, key, *args, mask=mask))


def _budgets_for(name: str, budgets: Sequence[int]) -> tuple[int | None, ...]:
    return tuple(budgets) if methods_lib.has_budget(name) else (None,)


def run_error(
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    budgets: Sequence[int] = (16, 32, 64, 128, 256),
    regimes: Sequence[str] = inputs_lib.REGIMES,
    seeds: Sequence[int] = (0, 1, 2),
    length: int = 1024,
    heads: int = 2,
    head_dim: int = 64,
    batch: int = 1,
    matrix_max_length: int = 2048,
    sharpness: float = 2.0,
    linformer_init: str = "pool",
    qkv: QKV | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Approximation errors of every method and budget, one record per (regime, seed).

    Each approximation is compared with the exact attention it targets (its registry
    ``target``: :func:`softmax_attention`, or :func:`kernelized_attention` for Skyformer).
    Methods without a budget (``linear``) are measured once per seed with ``budget=None``.

    Args:
      methods: registered method names.
      budgets: positive ints: num_landmarks (Nyström, spectral shift, Skyformer),
        num_features (Performer) or proj_len (Linformer).
      regimes: names from :data:`inputs.REGIMES`; ignored when ``qkv`` is given.
      seeds: ints; each draws new inputs and new method state (features, projections,
        landmark samples). With ``qkv`` only the method state changes.
      length, heads, head_dim, batch: synthetic input layout ``(batch, length, heads,
        head_dim)``.
      matrix_max_length: the implicit-matrix metrics (n×n per head) are computed only when
        n ≤ this; otherwise they are NaN in the records and reported as absent.
      sharpness: norm scale of the ``"sharp"`` regime.
      linformer_init: ``"pool"`` or ``"random"``, see :func:`methods.make_state`.
      qkv: fixed inputs (e.g. from a trained checkpoint) instead of synthetic regimes.
      progress: called with a short message after each (regime, seed).

    Returns:
      Records ``{"regime", "seed", "method", "budget", "output", "frobenius", "spectral",
      "length", "heads", "head_dim"}``; errors are dimensionless ratios.

    Raises:
      spectral_jax.UsageError: unknown method or regime, an empty or non-positive ``budgets`` list,
        ``qkv`` arrays of the wrong rank or mismatched shapes.

    Example:
      >>> from spectral_jax.lra.bench.error import run_error
      >>> rec = run_error(methods=["nystrom"], budgets=[8], regimes=["diffuse"], seeds=[0],
      ...                 length=64, head_dim=8)
      >>> 0 < rec[0]["output"] < 1
      True
    """
    methods = methods_lib.check_methods(methods)
    budgets = tuple(budgets)
    if not budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                          for b in budgets):
        raise UsageError(f"`budgets` must be a non-empty list of positive ints; got {budgets!r}.")
    if qkv is None:
        for regime in regimes:
            if regime not in inputs_lib.REGIMES:
                raise UsageError(f"`regimes`: {regime!r} is not one of {inputs_lib.REGIMES}.")
    else:
        shapes = {np.shape(qkv.query), np.shape(qkv.key)}
        if len(shapes) != 1 or len(np.shape(qkv.query)) != 4:
            raise UsageError(
                f"`qkv` query/key must both be (batch, n, heads, head_dim); got {shapes}."
            )
        batch, length, heads, head_dim = np.shape(qkv.query)
        regimes = (qkv.name,)
    # One compiled (output, implicit matrix) pair per method and budget serves every seed.
    compiled: dict[tuple[str, int | None], tuple[Callable[..., Array], Callable[..., Array]]] = {}
    records: list[dict[str, Any]] = []
    with_matrix = length <= matrix_max_length
    for regime in regimes:
        for seed in seeds:
            rng = jax.random.key(seed)
            input_rng, state_rng = jax.random.split(rng)
            if qkv is None:
                q, k, v = inputs_lib.make_inputs(
                    regime, input_rng, batch=batch, length=length, heads=heads,
                    head_dim=head_dim, sharpness=sharpness,
                )
                mask = None
            else:
                q, k, v = (jnp.asarray(a, jnp.float32) for a in (qkv.query, qkv.key, qkv.value))
                mask = pairwise_mask(qkv.mask)
            exact: dict[tuple[str, bool], tuple[Array, Array | None]] = {}
            for name in methods:
                spec_ = get_attention_spec(name)
                # A causal-only method (a recurrence) is compared with causal exact attention.
                target = (spec_.target, spec_.causal_only)
                if target not in exact:
                    ref = functools.partial(_TARGETS[target[0]], is_causal=target[1])
                    out = jax.jit(ref)(q, k, v, mask=mask)
                    mat = _jit_matrix(ref)(q, k, mask=mask) if with_matrix else None
                    exact[target] = (out, mat)
                y, s = exact[target]
                for budget in _budgets_for(name, budgets):
                    if (name, budget) not in compiled:
                        bound = methods_lib.bind(name, budget)
                        compiled[(name, budget)] = (jax.jit(bound), _jit_matrix(bound))
                    fn, matrix_fn = compiled[(name, budget)]
                    state = methods_lib.make_state(
                        name, jax.random.fold_in(state_rng, budget or 0), budget=budget,
                        length=length, head_dim=head_dim, linformer_init=linformer_init,
                    )
                    fro = spec = float("nan")
                    # No n×n matrix when V is also read as keys (inducing points, Luna).
                    if with_matrix and spec_.linear_in_value:
                        fro, spec = relative_matrix_errors(matrix_fn(q, k, state, mask=mask), s)
                    records.append({
                        "regime": regime, "seed": seed, "method": name, "budget": budget,
                        "output": relative_output_error(fn(q, k, v, state, mask=mask), y),
                        "frobenius": fro, "spectral": spec, "length": length, "heads": heads,
                        "head_dim": head_dim,
                    })
            if progress is not None:
                progress(f"error: regime={regime} seed={seed} done")
    return records


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds, per (regime, method, budget).

    Args:
      records: output of :func:`run_error`.

    Returns:
      Rows ``{"regime", "method", "budget", "seeds", "<metric>_mean", "<metric>_std"}`` for
      each metric in ``METRICS`` (std over seeds, ddof=0; NaN metrics stay NaN), in first-seen
      order.

    Example:
      >>> from spectral_jax.lra.bench.error import summarize
      >>> rows = summarize([
      ...     {"regime": "r", "method": "m", "budget": 4, "output": 0.1, "frobenius": 0.2,
      ...      "spectral": 0.3},
      ...     {"regime": "r", "method": "m", "budget": 4, "output": 0.3, "frobenius": 0.2,
      ...      "spectral": 0.3}])
      >>> round(rows[0]["output_mean"], 6), round(rows[0]["output_std"], 6)
      (0.2, 0.1)
    """
    groups: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["regime"], rec["method"], rec["budget"]), []).append(rec)
    rows = []
    for (regime, method, budget), recs in groups.items():
        row: dict[str, Any] = {"regime": regime, "method": method, "budget": budget,
                               "seeds": len(recs)}
        for metric in METRICS:
            values = np.array([r[metric] for r in recs], np.float64)
            row[f"{metric}_mean"] = float(values.mean())
            row[f"{metric}_std"] = float(values.std())
        rows.append(row)
    return rows
