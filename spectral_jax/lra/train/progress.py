"""Console output of a run: a rich progress bar with live metrics, and the final summary.

On a terminal the bar shows step, loss, accuracy and throughput; elsewhere (logs, CI) each
log step prints one line instead, so redirected output stays readable.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


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
        self.console.print(
            f"\n[bold]{r['task']} / {r['attention']} ({r['protocol']})[/bold]: "
            f"test accuracy {r['test_accuracy']:.4f} (best validation, step {r['best_step']}), "
            f"final {r['final_test_accuracy']:.4f}; majority-class baseline of the test split "
            f"{r['majority_baseline']:.4f}. {r['steps']} steps in {r['wall_time_s']:.0f} s.",
            highlight=False,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
