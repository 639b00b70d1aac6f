"""What a run reports: the metrics log, the console, and the cost figures of ``results.json``.

* :class:`MetricWriter`: JSON lines always, TensorBoard event files when tensorboardX is
  installed. Only process 0 writes (``enabled=False`` elsewhere), the clu ``just_logging``
  convention without clu's TensorFlow dependency.
* :class:`Reporter`: on a terminal a rich progress bar with step, loss, accuracy and
  throughput; elsewhere (logs, CI) each log step prints one line instead, so redirected output
  stays readable; and the final summary line.
* :func:`training_throughput` and :func:`step_peak_bytes`: a method is chosen from a table of
  accuracy *and* cost, so every run records the cost it paid, measured the same way for every
  method: the training rate from the logged windows, and the train step's peak device memory
  from XLA's buffer assignment of the compiled step.
* :class:`CompileCounter`: how many times XLA compiled each step during the run.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
from typing import Any

from jax import monitoring
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

METRICS_FILE = "metrics.jsonl"


class MetricWriter:
    """Appends ``{"step": s, "split": ..., **scalars}`` records to ``workdir/metrics.jsonl``.

    Args:
        workdir: run directory (created if missing).
        enabled: False on processes other than 0: every call is a no-op.
        resume_step: when resuming from a checkpoint at this step, records with a larger step
          (written after the checkpoint by the interrupted run) are dropped, so the log reads as
          if the run had never stopped. None starts a new log.
        tensorboard: also write ``workdir/tensorboard`` event files if tensorboardX imports.
        stage: a run of several stages (self-pretraining, then fine-tuning) tags each record
          with ``"stage": stage``; ``resume_step`` then counts this stage's steps only.
        keep_stages: the earlier stages, whose records are kept as they are.

    Example:
        >>> import tempfile
        >>> w = MetricWriter(tempfile.mkdtemp(), tensorboard=False)
        >>> w.write(10, "train", {"loss": 0.5})
        >>> w.close()
    """

    def __init__(
        self,
        workdir: str,
        *,
        enabled: bool = True,
        resume_step: int | None = None,
        tensorboard: bool = True,
        stage: str | None = None,
        keep_stages: tuple[str, ...] = (),
    ) -> None:
        self.enabled = enabled
        self.stage = stage
        self.path = os.path.join(workdir, METRICS_FILE)
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        kept = []
        if resume_step is not None and os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if r.get("stage") in keep_stages
                    or (r.get("stage") == stage and r["step"] <= resume_step)]
        elif keep_stages and os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if r.get("stage") in keep_stages]
        with open(self.path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                pass
            else:
                # purge_step drops events after the checkpoint in the same way as the JSONL.
                self._tb = SummaryWriter(
                    os.path.join(workdir, "tensorboard"),
                    purge_step=None if resume_step is None else resume_step + 1,
                )

    def write(self, step: int, split: str, scalars: dict[str, Any]) -> None:
        """Writes one record; non-finite floats are stored as null (JSON has no NaN)."""
        if not self.enabled:
            return
        clean = {k: jsonable(v) for k, v in scalars.items()}
        if self.stage is not None:
            clean["stage"] = self.stage
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": int(step), "split": split, **clean}) + "\n")
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(f"{split}/{key}", value, int(step))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def jsonable(value: Any) -> Any:
    """A scalar as JSON stores it: numpy and JAX scalars as Python numbers, NaN and inf as None.

    Example:
        >>> import numpy as np
        >>> jsonable(np.float32(0.5)), jsonable(float("nan"))
        (0.5, None)
    """
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Reads a ``metrics.jsonl`` file, skipping a torn last line left by a killed run.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> w = MetricWriter(d, tensorboard=False); w.write(3, "train", {"loss": float("nan")})
        >>> read_metrics(os.path.join(d, METRICS_FILE))
        [{'step': 3, 'split': 'train', 'loss': None}]
    """
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records



class Reporter:
    """Progress bar and log lines for steps ``start+1 .. total``.

    Args:
        total: the run's number of steps.
        start: the step the run starts after (the resumed checkpoint's step, else 0).
        enabled: False on processes other than 0.

    Example:
        >>> r = Reporter(10, enabled=False)
        >>> r.advance(); r.close()
    """

    def __init__(self, total: int, *, start: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        # soft_wrap: lines are never broken at the console width (80 when not a terminal),
        # so each result stays on one line for grep.
        self.console = Console(stderr=False, soft_wrap=True)
        self._bar = None
        if not enabled:
            return
        if start:
            self.console.print(f"Resuming from the checkpoint at step {start}.")
        if self.console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                console=self.console,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, status="")
            self._bar.start()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def train(self, step: int, m: dict[str, float]) -> None:
        if not self.enabled:
            return
        status = (f"loss {m['loss']:.3f} acc {m['accuracy']:.3f} "
                  f"{m['examples_per_s']:.0f} ex/s {m['tokens_per_s'] / 1e3:.1f}k tok/s")
        if self._bar is not None:
            self._bar.update(self._task, status=status)
        else:
            self.console.print(f"step {step}: {status}", highlight=False)

    def validation(self, step: int, m: dict[str, float], best: float) -> None:
        if self.enabled:
            self.console.print(
                f"step {step}: validation loss {m['loss']:.3f} accuracy {m['accuracy']:.4f} "
                f"(best {best:.4f})", highlight=False,
            )

    def summary(self, results: dict[str, Any]) -> None:
        if not self.enabled:
            return
        r = results
        pre = r.get("pretrain") or {}
        # The stages are timed apart (results.json: wall_time_s and pretrain.wall_time_s).
        before = (f", after {pre['steps']} pretraining steps in {pre['wall_time_s']:.0f} s"
                  if pre.get("wall_time_s") is not None else "")
        self.console.print(
            f"\n[bold]{r['task']} / {r['attention']} ({r['protocol']})[/bold]: "
            f"test accuracy {r['test_accuracy']:.4f} (best validation, step {r['best_step']}), "
            f"final {r['final_test_accuracy']:.4f}; majority-class baseline of the test split "
            f"{r['majority_baseline']:.4f}. {r['steps']} steps in {r['wall_time_s']:.0f} s"
            f"{before}.",
            highlight=False,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None



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
        >>> d = tempfile.mkdtemp()
        >>> w = MetricWriter(d, tensorboard=False)
        >>> for step, rate in [(10, 5.0), (20, 40.0), (30, 44.0), (40, 42.0)]:
        ...     w.write(step, "train", {"examples_per_s": rate, "tokens_per_s": 8 * rate})
        >>> training_throughput(d, batch_size=4)
        {'examples_per_s': 42.0, 'tokens_per_s': 336.0, 'steps_per_s': 10.5}
    """
    path = os.path.join(workdir, METRICS_FILE)
    records = read_metrics(path) if os.path.exists(path) else []
    windows = [r for r in records if r.get("split") == "train" and r.get("examples_per_s")
               and r.get("stage") != "pretrain"]  # the classifier's rate only
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


class CompileCounter:
    """Counts XLA compilations by function name while open (a context manager).

    It listens to JAX's backend-compile event, which names the jitted function
    (``"jit(train_step)"``), so the count does not depend on the jit cache's contents (a
    cache shared with many other programs, as in a test worker, may have evicted an entry
    by the time the run ends). A persistent-compilation-cache hit loads an executable
    without compiling and is not counted.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def double(x):
        ...     return 2 * x
        >>> with CompileCounter() as counter:
        ...     _ = jax.jit(double)(jnp.ones(3)), jax.jit(double)(jnp.ones(3))
        >>> counter.count(double)
        1
    """

    _EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self._counts: collections.Counter[str] = collections.Counter()

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        del duration
        if event == self._EVENT:
            self._counts[kwargs.get("fun_name", "")] += 1

    def __enter__(self) -> CompileCounter:
        monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc: Any) -> None:
        monitoring.unregister_event_duration_listener(self._listen)

    def count(self, fun: Any) -> int:
        """Compilations of ``fun`` (a Python function, or a jitted one) since entering."""
        return self._counts[f"jit({fun.__name__})"]
