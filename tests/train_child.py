"""A training run in a child process that signals itself while fetching one step's batch.

The resume tests stop a real run at a known point (SIGKILL: no chance to save; SIGINT or
SIGTERM: the loop checkpoints that step) and compare the resumed run with an uninterrupted
one. The child runs on 8 simulated CPU devices with XLA's optimisations off, as the test
process does, so both compile the same programs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The child compiles as the pytest workers do (conftest.py turns XLA's optimisations off), so
# a run interrupted in the child and resumed in a worker runs the same programs bit for bit.
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
       "JAX_DISABLE_MOST_OPTIMIZATIONS": "true"}

def tiny_listops_overrides(data_dir: Path, steps: int = 8) -> list[str]:
    """Overrides of `lra/listops:quick` for a run of a few seconds: a 1-layer model on 48
    generated examples of at most 32 tokens, evaluated and logged every 4 steps."""
    return [
        f"data.dir={data_dir}", f"train.steps={steps}", "train.batch_size=8",
        "train.eval_every=4", "train.log_every=4", "train.eval_steps=-1",
        "train.schedule.warmup_steps=1", "model.num_layers=1", "model.embed_dim=16",
        "model.qkv_dim=16", "model.mlp_dim=32", "model.dropout_rate=0.2",
        "model.max_length=32", "data.options.max_length=32", "data.generate.num_train=48",
        "data.generate.num_val=16", "data.generate.num_test=12", "data.generate.min_length=8",
        "data.generate.max_length=32", "data.generate.max_depth=3",
    ]


# argv: `spectral-jax` arguments, or `--config-json FILE WORKDIR` for train_and_evaluate on a
# config that no config file gives. STOP_SIGNAL (0: none) is sent at the batch of STOP_AT_STEP.
_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_disable_most_optimizations", True)
    from spectral_jax.lra import cli, data
    signum, at_step = int(os.environ["STOP_SIGNAL"]), int(os.environ["STOP_AT_STEP"])
    original = data.iterate_batches
    def signalling(split, batch_size, **kw):
        it = original(split, batch_size, **kw)
        if not kw.get("shuffle"):
            yield from it
            return
        for step, batch in enumerate(it, start=kw.get("start_step", 0) + 1):
            if step == at_step and signum:
                os.kill(os.getpid(), signum)
            yield batch
    data.iterate_batches = signalling
    if sys.argv[1] == "--config-json":
        import ml_collections
        from spectral_jax.lra.train import train_and_evaluate
        with open(sys.argv[2]) as f:
            train_and_evaluate(ml_collections.ConfigDict(json.load(f)), sys.argv[3])
    else:
        sys.exit(cli.main(sys.argv[1:]))
""")


def run_child(args: list[str], *, signum: int = 0, at_step: int = 6,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the child with ``args``; it sends itself ``signum`` (0: none) at step ``at_step``."""
    env = {**ENV, "STOP_SIGNAL": str(int(signum)), "STOP_AT_STEP": str(at_step)}
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
