"""Cost figures of a finished run for ``results.json``: training throughput and step memory.

A method is chosen from a table of accuracy *and* cost, so every run records the cost it paid,
measured the same way for every method: the training rate from the logged windows, and the
train step's peak device memory from XLA's buffer assignment of the compiled step.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from spectral_jax.lra.train.writers import METRICS_FILE, read_metrics


def training_throughput(workdir: str, batch_size: int) -> dict[str, float | None]:
    """Median training rate over the logged windows of ``workdir/metrics.jsonl``.

    Each ``"train"`` record's ``examples_per_s`` covers one logging window, timed after its
    steps finished and without the validation passes. The window of the first step also holds
    the step's compilation (as does the first window after a resume), so the first record is
    left out when there are others, and the median keeps a resume's compile window from
    moving the figure.

    Args:
        workdir: a run directory.
        batch_size: ``train.batch_size`` (global), to turn examples/s into steps/s.

    Returns:
        ``{"examples_per_s", "tokens_per_s", "steps_per_s"}``; values are None when no train
        record exists (no metrics file, or no window logged).

    Example:
        >>> import tempfile
        >>> from spectral_jax.lra.train.writers import MetricWriter
        >>> d = tempfile.mkdtemp()
        >>> w = MetricWriter(d, tensorboard=False)
        >>> for step, rate in [(10, 5.0), (20, 40.0), (30, 44.0), (40, 42.0)]:
        ...     w.write(step, "train", {"examples_per_s": rate, "tokens_per_s": 8 * rate})
        >>> training_throughput(d, batch_size=4)
        {'examples_per_s': 42.0, 'tokens_per_s': 336.0, 'steps_per_s': 10.5}
    """
    path = os.path.join(workdir, METRICS_FILE)
    records = read_metrics(path) if os.path.exists(path) else []
    windows = [r for r in records if r.get("split") == "train" and r.get("examples_per_s")]
    if len(windows) > 1:
        windows = windows[1:]
    if not windows:
        return {"examples_per_s": None, "tokens_per_s": None, "steps_per_s": None}
    examples = statistics.median(r["examples_per_s"] for r in windows)
    tokens = statistics.median(r.get("tokens_per_s") or 0.0 for r in windows)
    return {"examples_per_s": float(examples), "tokens_per_s": float(tokens),
            "steps_per_s": float(examples) / batch_size}


def step_peak_bytes(jitted: Any, *args: Any) -> int | None:
    """Peak device memory (bytes, per device) of ``jitted(*args)`` from its compiled form.

    After the step has run, ``lower(...).compile()`` with the same arguments is a cache hit,
    so this costs no second compilation. The figure is XLA's buffer assignment (arguments +
    outputs + temporaries − donated aliases, or XLA's own peak when larger), the number
    ``bench speed`` reports too; on CPU it undercounts what the runtime holds.

    Returns:
        Bytes, or None where the backend gives no memory analysis.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> step_peak_bytes(jax.jit(lambda x: x @ x), jnp.ones((64, 64))) >= 2 * 64 * 64 * 4
        True
    """
    from spectral_jax.lra.compiled import peak_bytes

    try:
        return peak_bytes(jitted.lower(*args).compile())
    except NotImplementedError:
        return None
