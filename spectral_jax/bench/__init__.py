"""Speed, memory and approximation-error benchmarks of the attention methods.

:func:`run_speed` compiles each method, reads its peak memory from XLA before running
anything, and times forward and forward+backward passes against exact attention;
:func:`run_error` measures each approximation's error against the exact attention it targets
on synthetic regimes or on q/k/v captured from a trained model. The ``spectral-jax bench``
command (:mod:`spectral_jax.bench.cli`) drives both and writes JSON and PNG files.
"""

from spectral_jax.bench.error import (
    QKV,
    implicit_matrix,
    relative_matrix_errors,
    relative_output_error,
    run_error,
    summarize,
)
from spectral_jax.bench.inputs import REGIMES, make_inputs, random_walk_tokens
from spectral_jax.bench.methods import BUDGET_PARAMS, bind, has_budget, make_state
from spectral_jax.bench.speed import (
    add_ratios,
    benchmark_function,
    default_memory_budget_bytes,
    peak_bytes,
    run_speed,
)

__all__ = [
    "BUDGET_PARAMS",
    "QKV",
    "REGIMES",
    "add_ratios",
    "benchmark_function",
    "bind",
    "default_memory_budget_bytes",
    "has_budget",
    "implicit_matrix",
    "make_inputs",
    "make_state",
    "peak_bytes",
    "random_walk_tokens",
    "relative_matrix_errors",
    "relative_output_error",
    "run_error",
    "run_speed",
    "summarize",
]
