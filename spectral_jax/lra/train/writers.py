"""Metric writers: JSON lines always, TensorBoard event files when tensorboardX is installed.

Only process 0 writes (``enabled=False`` elsewhere), the clu ``just_logging`` convention without
clu's TensorFlow dependency.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

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
    ) -> None:
        self.enabled = enabled
        self.path = os.path.join(workdir, METRICS_FILE)
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        kept = []
        if resume_step is not None and os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
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
        clean = {k: _jsonable(v) for k, v in scalars.items()}
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


def _jsonable(value: Any) -> Any:
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
