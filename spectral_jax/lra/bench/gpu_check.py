"""One prepared check of a GPU machine: speed of every method, a ListOps training run, versions.

    python -m spectral_jax.lra.bench.gpu_check --out gpu_results          # on the GPU, <= 8 minutes
    python -m spectral_jax.lra.bench.gpu_check --out /tmp/smoke --smoke   # on a CPU, < 1 minute

Writes, in ``--out``:

- ``environment.json``: device, JAX / jaxlib / CUDA / cuDNN versions, and how the attention
  functions split heads on this backend (``head_chunk_size``: on GPU/TPU every (example, head)
  slice at once, without a flag; the CPU cache chunking only on CPU);
- ``speed_bfloat16.json``, ``speed_float32.json`` (+ ``.png``): ``bench speed`` records for
  every registered method at n = 1k, 4k, 16k, 64k (batch 1, 8 heads, head_dim 64), forward and
  forward+backward, next to exact attention through ``jax.nn.dot_product_attention`` with
  ``implementation="xla"`` and ``"cudnn"``; what would not fit in memory, or does not compile
  here, is skipped with the reason;
- ``train_listops.json``: a ListOps run at LRA length (n = 2000, LRA's model) with
  ``spectral_shift`` for about 2 minutes: examples/s, steps/s, peak device memory;
- ``gpu_check.json``: all of the above, and the time each part took.

Each part is guarded: an error is recorded in the JSON and the next part runs. The training run
comes first (its peak-memory counter is the process's); the speed part then runs one (dtype,
length) at a time and starts no new one once the time budget (400 s from the start; one
length's compiles and timings can run past it by about a minute) is spent, saying which were
left out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

FULL = {"lengths": (1024, 4096, 16384, 65536), "batch": 1, "heads": 8, "head_dim": 64,
        "repeats": 5, "warmup": 1, "train_seconds": 120.0, "time_budget_s": 400.0}
SMOKE = {"lengths": (64,), "batch": 1, "heads": 2, "head_dim": 8,
         "repeats": 1, "warmup": 0, "train_seconds": 60.0, "time_budget_s": 300.0}


def environment() -> dict[str, Any]:
    """Device, versions, and how the attention functions split heads on this backend.

    Example:
        >>> environment()["backend"] in ("cpu", "gpu", "tpu")
        True
    """
    import jax
    import jaxlib

    from spectral_jax.attention import resolve_head_chunk_size

    device = jax.devices()[0]
    env: dict[str, Any] = {
        "backend": jax.default_backend(), "device": getattr(device, "device_kind", str(device)),
        "device_count": jax.device_count(), "jax": jax.__version__,
        "jaxlib": jaxlib.__version__, "python": platform.python_version(),
        "host": platform.node(), "cpu_count": os.cpu_count(),
    }
    try:
        from jax._src.lib import cuda_versions  # None without the CUDA plugin

        if cuda_versions is not None:
            env.update(cuda_runtime=cuda_versions.cuda_runtime_get_version(),
                       cuda_driver=cuda_versions.cuda_driver_get_version(),
                       cudnn=cuda_versions.cudnn_get_version())
    except Exception as err:
        env["cuda_versions_error"] = repr(err)
    stats = device.memory_stats() or {}
    env["device_memory_bytes"] = stats.get("bytes_limit")
    if env["backend"] == "gpu":
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            env["nvidia_smi"] = repr(err)
    # What a call with head_chunk_size=None does at the benchmark's shape (8 slices): the
    # number of (example, head) slices computed at once.
    env["head_chunk_size_default"] = {
        str(n): resolve_head_chunk_size("nystrom", None, 8, n) for n in (1024, 65536)}
    env["all_heads_at_once"] = all(v == 8 for v in env["head_chunk_size_default"].values())
    return env


def speed_part(sizes: dict[str, Any], out: str, deadline: float, say) -> dict[str, Any]:
    """``bench speed`` at each (dtype, length), bfloat16 first, until ``deadline``."""
    from spectral_jax.attention import available_attentions
    from spectral_jax.lra.bench import report, speed

    summary: dict[str, Any] = {"left_out": [], "errors": []}
    for dtype in ("bfloat16", "float32"):
        records: list[dict[str, Any]] = []
        for n in sizes["lengths"]:
            if time.monotonic() > deadline:
                summary["left_out"].append(f"{dtype} n={n}: time budget spent")
                say(f"speed {dtype} n={n}: left out, time budget spent")
                continue
            try:
                records += speed.run_speed(
                    methods=list(available_attentions()), lengths=[n], batch=sizes["batch"],
                    heads=sizes["heads"], head_dim=sizes["head_dim"], dtype=dtype,
                    repeats=sizes["repeats"], warmup=sizes["warmup"],
                    exact_implementations=speed.EXACT_IMPLEMENTATIONS, progress=say)
            except Exception as err:
                summary["errors"].append(f"{dtype} n={n}: {type(err).__name__}: {err}")
                say(f"speed {dtype} n={n}: {type(err).__name__}: {err}")
        records = speed.add_ratios(records)
        payload = {"kind": "speed", "config": {**sizes, "dtype": dtype,
                                               "exact_implementations": ["xla", "cudnn"]},
                   "records": records}
        report.write_json(os.path.join(out, f"speed_{dtype}.json"), payload)
        if any(r.get("time_s") for r in records):
            report.plot_speed(records, os.path.join(out, f"speed_{dtype}.png"),
                              title=f"{dtype}, batch {sizes['batch']}, {sizes['heads']} heads, "
                                    f"head_dim {sizes['head_dim']}")
        summary[dtype] = {"timed": sum(r["time_s"] is not None for r in records),
                          "skipped": sum(r["skipped"] is not None for r in records)}
    return summary


def _listops_config(workdir: str, smoke: bool):
    from spectral_jax.lra.train.overrides import load_config

    spec = "lra/listops"
    if smoke:
        overrides = ["model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16",
                     "model.mlp_dim=32", "model.num_heads=2", "model.max_length=64",
                     "data.options.max_length=64", "train.steps=8", "train.batch_size=8",
                     "train.log_every=2", "train.eval_every=8", "train.eval_steps=1",
                     "model.attention_kwargs.num_landmarks=8"]
        generate = {"num_train": 64, "num_val": 8, "num_test": 8, "min_length": 16,
                    "max_length": 64, "max_depth": 4, "max_args": 5, "seed": 0}
    else:
        # LRA's ListOps model and batch (4 layers, width 512, 8 heads, batch 32) at n = 2000;
        # steps far beyond 2 minutes: the run is stopped by the clock. 2,000 training
        # examples are repeated: this measures speed and memory, not accuracy.
        overrides = ["train.steps=1000000", "train.log_every=50", "train.eval_every=1000000",
                     "train.eval_steps=1"]
        generate = {"num_train": 2000, "num_val": 32, "num_test": 32, "min_length": 500,
                    "max_length": 2000, "max_depth": 10, "max_args": 10, "seed": 0}
    data_dir = os.path.join(workdir, "listops_data")
    overrides.append(f"data.dir={data_dir}")
    return load_config(f"{spec}:attention=spectral_shift,protocol=lra", overrides), generate


def train_part(sizes: dict[str, Any], out: str, smoke: bool, say) -> dict[str, Any]:
    """Trains ListOps with spectral_shift for ``train_seconds`` (or until its steps end).

    The run is stopped from a timer thread (``KeyboardInterrupt`` in this thread), so the
    figures come from its logged windows (median examples/s after the first window) and the
    device's peak memory counter; a run that ends first reports its ``results.json``.
    """
    import tempfile

    import jax

    from spectral_jax.lra import data
    from spectral_jax.lra.train import report, train_and_evaluate

    workdir = tempfile.mkdtemp(prefix="gpu_check_listops_")
    config, generate = _listops_config(workdir, smoke)
    t0 = time.monotonic()
    data.listops_generator.generate(config.data.dir, **generate)
    result: dict[str, Any] = {"generate_s": time.monotonic() - t0, "data": generate,
                              "workdir": workdir, "config": config.to_dict()}
    say(f"train: ListOps generated in {result['generate_s']:.0f} s; training spectral_shift "
        f"for up to {sizes['train_seconds']:.0f} s")
    timer = threading.Timer(sizes["train_seconds"], _interrupt_main)
    t0 = time.monotonic()
    timer.start()
    try:
        results = train_and_evaluate(config, os.path.join(workdir, "run"))
        result.update(stopped_by="steps", results={
            k: v for k, v in results.items() if k != "config"})
    except KeyboardInterrupt:
        result["stopped_by"] = "clock"
    finally:
        timer.cancel()
    result["train_s"] = time.monotonic() - t0
    result.update(report.training_throughput(os.path.join(workdir, "run"),
                                                config.train.batch_size))
    shutil.rmtree(workdir, ignore_errors=True)
    del result["workdir"]
    stats = jax.devices()[0].memory_stats() or {}
    result["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    if "results" in result:
        result["train_step_peak_bytes"] = result["results"].get("train_step_peak_bytes")
    say(f"train: {result['examples_per_s'] or 0:.1f} examples/s, peak device memory "
        f"{(result['peak_bytes_in_use'] or 0) / 2**30:.2f} GiB (stopped by {result['stopped_by']})")
    return result


def _interrupt_main() -> None:
    import _thread

    _thread.interrupt_main()


def run_check(out: str, *, smoke: bool = False, time_budget_s: float | None = None,
              say=print) -> dict[str, Any]:
    """Runs the three parts and writes their JSON files into ``out``.

    Args:
        out: the results folder (created).
        smoke: tiny sizes, for a CPU (the test suite runs it).
        time_budget_s: seconds from the start after which no new speed length starts
          (default 400 s, 300 s smoke).

    Returns:
        The contents of ``gpu_check.json``.

    Example:
        >>> # run_check("gpu_results")
    """
    sizes = dict(SMOKE if smoke else FULL)
    if time_budget_s is not None:
        sizes["time_budget_s"] = float(time_budget_s)
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    summary: dict[str, Any] = {"smoke": smoke, "sizes": sizes, "parts": {}}
    # Training first: its peak-memory counter is the process's, which the speed part's
    # exact attention at 16k would otherwise have set.
    parts = (
        ("environment", lambda: environment()),
        ("train_listops", lambda: train_part(sizes, out, smoke, say)),
        ("speed", lambda: speed_part(sizes, out, start + sizes["time_budget_s"], say)),
    )
    for name, part in parts:
        t0 = time.monotonic()
        try:
            value = part()
        except Exception as err:
            value = {"error": f"{type(err).__name__}: {err}",
                     "traceback": traceback.format_exc()[-4000:]}
            say(f"{name}: FAILED: {type(err).__name__}: {err}")
        summary["parts"][name] = {"seconds": time.monotonic() - t0}
        summary[name] = value
        if name in ("environment", "train_listops"):
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump(value, f, indent=2, default=str)
        say(f"{name}: done in {time.monotonic() - t0:.0f} s")
    summary["total_s"] = time.monotonic() - start
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    say(f"gpu check: wrote {out}/gpu_check.json in {summary['total_s']:.0f} s")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectral_jax.lra.bench.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSON results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for a CPU")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds after which no new speed length starts (default 400; "
                             "smoke 300)")
    args = parser.parse_args(argv)
    summary = run_check(args.out, smoke=args.smoke, time_budget_s=args.time_budget,
                        say=lambda m: print(m, flush=True))
    failed = [k for k in ("environment", "speed", "train_listops")
              if isinstance(summary.get(k), dict) and "error" in summary[k]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
