"""Stopping on SIGINT or SIGTERM: finish the step, save a checkpoint, exit non-zero.

Ctrl-C sends SIGINT; Slurm and Cloud TPU preempt with SIGTERM (then SIGKILL after a grace
period). Inside :class:`StopSignals` the first of either only records the signal; the
training loop checks it after every step, checkpoints that step and raises
:class:`TrainingInterrupted`, and ``spectral-jax train`` prints its one line and exits with
``128 + signal`` (130 for SIGINT, 143 for SIGTERM), the status a shell gives a process the
signal killed. A second SIGINT stops at once (``KeyboardInterrupt``, no checkpoint); a second
SIGTERM is ignored (Slurm may signal the whole job, and a sweep forwards its own).

``spectral-jax sweep`` runs each training run in its own session, so a terminal's Ctrl-C
reaches the sweep alone; :func:`forward_signals` hands the signal to the running child once
and the sweep stops after the child has saved.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or inf; the last good checkpoint is kept."""

    exit_status = 1  # `spectral-jax train` exits with 1, not the 2 of a user error


class Interrupted(KeyboardInterrupt):
    """A run or sweep stopped by ``signum``; ``exit_status`` is ``128 + signum``.

    A ``KeyboardInterrupt``, so code that cleans up on Ctrl-C (and ``except Exception``
    clauses that must not swallow it) treats it as a Ctrl-C.
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_status = 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0])


class TrainingInterrupted(Interrupted):
    """Training stopped by a signal after checkpointing ``step``.

    Example:
        >>> str(TrainingInterrupted(310, signal.SIGTERM))
        'interrupted at step 310; checkpoint saved; rerun the same command to resume'
        >>> TrainingInterrupted(310, signal.SIGINT).exit_status
        130
        >>> str(TrainingInterrupted(40, signal.SIGINT, stage="pretraining"))
        'interrupted at pretraining step 40; checkpoint saved; rerun the same command to resume'
    """

    def __init__(self, step: int, signum: int, *, stage: str | None = None) -> None:
        where = f"{stage} step" if stage else "step"
        super().__init__(
            f"interrupted at {where} {step}; checkpoint saved; rerun the same command to resume",
            signum)
        self.step = int(step)


def wait_for_previous_step(window: list) -> None:
    """Blocks until the step before the last one dispatched has finished.

    JAX dispatches steps asynchronously, so without a wait the host would run up to
    ``train.log_every`` steps ahead of the device, and a stop signal, seen by the host at
    once, would take effect only when those steps had run (over a minute for 50 steps at
    LRA length on a CPU). Waiting for step ``t - 1`` after dispatching step ``t`` keeps one
    step in flight (the next batch is prepared while the device computes) and bounds the
    delay to about two steps.

    Args:
        window: the metrics of the steps dispatched since the last log line, in order.

    Example:
        >>> import jax.numpy as jnp
        >>> window = [jnp.ones(3), jnp.ones(3) * 2]
        >>> wait_for_previous_step(window)
        >>> window[0].is_ready()
        True
    """
    if len(window) > 1:
        import jax

        jax.block_until_ready(window[-2])


class StopSignals:
    """While entered, SIGINT and SIGTERM set :attr:`signum` instead of stopping the process.

    Handlers can only be installed from the main thread; elsewhere, or with
    ``enabled=False``, nothing is installed and :attr:`signum` stays None. Leaving restores
    the previous handlers.

    Args:
        enabled: install the handlers.

    Example:
        >>> import os
        >>> with StopSignals() as stop:
        ...     os.kill(os.getpid(), signal.SIGTERM)
        >>> stop.signum == signal.SIGTERM
        True
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        self.signum = None
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be reinstalled from here.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous = {}


@contextlib.contextmanager
def forward_signals(process: subprocess.Popen) -> Iterator[StopSignals]:
    """Passes SIGINT and SIGTERM received here on to ``process`` (a sweep's training run).

    The yielded :class:`StopSignals` records the first signal; each signal is forwarded as
    received, so a second Ctrl-C stops the child at once, as it would stop ``train`` alone.

    Example:
        >>> import os, sys
        >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        >>> with forward_signals(child) as stop:
        ...     os.kill(os.getpid(), signal.SIGTERM)
        ...     code = child.wait()
        >>> stop.signum == signal.SIGTERM, code == -signal.SIGTERM
        (True, True)
    """
    stop = StopSignals()

    def handle(signum: int, frame: object) -> None:
        if stop.signum is None:
            stop.signum = signum
        if process.poll() is None:
            process.send_signal(signum)

    stop._handle = handle  # the same bookkeeping, plus the forwarding
    with stop:
        yield stop
