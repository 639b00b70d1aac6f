"""Speed, memory and approximation-error benchmarks of the attention methods.

:func:`run_speed` compiles each method, reads its peak memory from XLA before running
anything, and times forward and forward+backward passes against exact attention;
:func:`run_error` measures each approximation's error against the exact attention it targets
on synthetic regimes or on q/k/v captured from a trained model. The ``spectral-jax bench``
command (:mod:`spectral_jax.lra.cli.bench`) drives both and writes JSON and PNG files.
"""

from __future__ import annotations

import importlib
from typing import Any

from spectral_jax.lra import require

require()

# name -> module; imported on first use so that `spectral-jax --help` does not load JAX.
_EXPORTS = {
    **dict.fromkeys(("QKV", "implicit_matrix", "relative_matrix_errors",
                     "relative_output_error", "run_error", "summarize"), "error"),
    **dict.fromkeys(("REGIMES", "make_inputs", "random_walk_tokens"), "inputs"),
    **dict.fromkeys(("BUDGET_PARAMS", "bind", "has_budget", "make_state"), "methods"),
    **dict.fromkeys(("default_memory_budget_bytes", "peak_bytes"), "memory"),
    **dict.fromkeys(("add_ratios", "benchmark_function", "run_speed"), "speed"),
}

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


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"spectral_jax.lra.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'spectral_jax.lra.bench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
