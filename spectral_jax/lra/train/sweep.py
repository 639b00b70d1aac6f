"""``spectral-jax sweep``: every (method, seed) of one config trained, evaluated and tabulated.

    spectral-jax sweep --config lra/image:quick --attention all --seeds 0 1 \\
        --workdir runs/image_sweep [--config.train.steps=200 ...]

Each pair gets its own run folder ``DIR/<method>-seed<k>``, trained by ``spectral-jax train``
with ``FILE:ARG,attention=<method>`` (so the method brings its own defaults) and
``--config.seed=<k>``. Finished runs are skipped, interrupted ones resume from their last
checkpoint, and a failed run (config error, NaN, crash) is recorded in its folder's
``failed.json`` with the reason, without stopping the others; the next sweep retries it. At
the end ``DIR/table.md``, ``DIR/table.json`` and ``DIR/accuracy_vs_throughput.png`` are written
from the run folders alone, so ``spectral-jax table DIR/*`` reproduces them.

By default each run is its own process: an out-of-memory kill, a segfault or an XLA abort then
fails one run, not the sweep; every run starts with empty device memory and compile caches, so
its peak memory and compile counts are its own; and the sweep process itself never touches
the accelerator. ``--in-process`` runs them in this process instead (tests, debugging).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from spectral_jax import UsageError
from spectral_jax.lra.train.interrupt import Interrupted, forward_signals

# A run's log, next to its results: the subprocess's whole output.
LOG_FILE = "train.log"
TABLE_MD, TABLE_JSON, PLOT_PNG, SWEEP_JSON = (
    "table.md", "table.json", "accuracy_vs_throughput.png", "sweep.json")


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One (method, seed) pair of a sweep.

    Attributes:
        method: registry name.
        seed: the run's ``config.seed``.
        workdir: its run folder, ``DIR/<method>-seed<seed>``.
        config_spec: ``FILE:ARG,attention=<method>``.
        overrides: the sweep's ``a.b=VALUE`` overrides plus ``seed=<seed>``.
    """

    method: str
    seed: int
    workdir: str
    config_spec: str
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return os.path.basename(self.workdir)


def parse_methods(spec: str) -> tuple[str, ...]:
    """``"all"`` or ``"a,b,..."`` -> registered method names, in the given order.

    Raises:
        spectral_jax.UsageError: an unknown or empty name (the message lists the registered ones).

    Example:
        >>> parse_methods("nystrom, softmax")
        ('nystrom', 'softmax')
        >>> "spectral_shift" in parse_methods("all")
        True
    """
    from spectral_jax.attention import available_attentions

    known = available_attentions()
    if spec.strip() == "all":
        return tuple(known)
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",")))
    for name in names:
        if name not in known:
            raise UsageError(
                f"--attention: {name!r} is not a registered method; known: "
                f"{', '.join(known)} (or 'all')"
            )
    return names


def plan(config: str, methods: tuple[str, ...], seeds: list[int], workdir: str,
         overrides: list[str] = ()) -> list[SweepRun]:
    """The runs of a sweep, method-major.

    Args:
        config: ``FILE.py[:ARG]``; ``ARG`` must not set ``attention`` (the sweep does).
        methods: registered names (see :func:`parse_methods`).
        seeds: distinct ints.
        workdir: the sweep folder.
        overrides: ``a.b=VALUE`` for every run; ``seed`` is the sweep's.

    Raises:
        spectral_jax.UsageError: ``ARG`` or an override already sets the method or the seed,
          no seeds, or repeated seeds.

    Example:
        >>> [r.name for r in plan("c.py:quick", ("softmax",), [0, 1], "out")]
        ['softmax-seed0', 'softmax-seed1']
    """
    path, _, arg = config.partition(":")
    for item in filter(None, (p.strip() for p in arg.split(","))):
        if item.partition("=")[0].strip() in ("attention", "seed"):
            raise UsageError(
                f"--config {config!r} sets {item!r}; the sweep sets the method (--attention) and "
                "the seed (--seeds) of each run itself"
            )
    for override in overrides:
        if override.partition("=")[0] in ("seed", "model.attention"):
            raise UsageError(f"--config.{override}: the sweep sets this per run (--attention, "
                             "--seeds)")
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {seeds}: give one or more distinct ints")
    runs = []
    for method in methods:
        spec = f"{path}:{arg + ',' if arg else ''}attention={method}"
        for seed in seeds:
            runs.append(SweepRun(method, seed, os.path.join(workdir, f"{method}-seed{seed}"),
                                 spec, (*overrides, f"seed={seed}")))
    return runs


def run_sweep(
    config: str,
    methods: tuple[str, ...],
    seeds: list[int],
    workdir: str,
    overrides: list[str] = (),
    *,
    in_process: bool = False,
    overwrite: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trains every (method, seed) not finished yet, then writes the table, JSON and plot.

    Args:
        config, methods, seeds, workdir, overrides: see :func:`plan`.
        in_process: call ``train_and_evaluate`` here instead of one ``spectral-jax train``
          process per run.
        overwrite: replace run folders holding a run with a different config (without it
          the sweep refuses to start, naming them).
        say: where progress lines go.

    Returns:
        ``{"runs": [{"name", "method", "seed", "status", "seconds", "reason"}], "table":
        <table.json contents>}``; status is ``skipped`` (finished before), ``finished`` or
        ``failed``.

    Raises:
        spectral_jax.UsageError: bad arguments (see :func:`plan`), or run folders holding
          another config.
        KeyboardInterrupt: passed on; the next sweep resumes where this one stopped. On
          SIGINT or SIGTERM the running run gets the signal, saves and stops, and the sweep
          raises :class:`spectral_jax.lra.train.interrupt.Interrupted` after it.

    Example:
        >>> # run_sweep("lra/listops:quick", ("softmax", "nystrom"), [0, 1], "sw")
    """
    # Imported here like the module's other training imports: plan() and tables need no jax.
    from spectral_jax.lra.train.workdir import config_mismatch

    runs = plan(config, methods, seeds, workdir, overrides)
    configs = {}
    for run in runs:
        try:
            configs[run.name] = _load(run)
        except (UsageError, FileNotFoundError) as e:
            configs[run.name] = e
    stale = [(run, why) for run in runs if not isinstance(configs[run.name], Exception)
             and (why := config_mismatch(run.workdir, configs[run.name]))]
    if stale and not overwrite:
        names = "; ".join(f"{r.workdir} ({why})" for r, why in stale)
        raise UsageError(f"run folders hold runs with a different config: {names}. Use another "
                         "--workdir, or --overwrite to replace them")
    replace = {r.name for r, _ in stale}
    os.makedirs(workdir, exist_ok=True)
    log: list[dict[str, Any]] = []
    durations: dict[str, list[float]] = collections.defaultdict(list)
    started = time.perf_counter()
    for index, run in enumerate(runs, start=1):
        head = f"[{index}/{len(runs)}] {run.name}"
        cfg = configs[run.name]
        entry = {"name": run.name, "method": run.method, "seed": run.seed, "reason": None}
        if run.name not in replace and os.path.exists(os.path.join(run.workdir, "results.json")):
            say(f"{head}: finished before, skipped")
            log.append({**entry, "status": "skipped", "seconds": 0.0})
            continue
        partial = os.path.exists(os.path.join(run.workdir, "config.json"))
        say(f"{head}: {'resuming an interrupted run' if partial else 'starting'} "
            f"({run.config_spec}, seed {run.seed})")
        _clear_failure(run.workdir)
        t0 = time.perf_counter()
        if isinstance(cfg, Exception):
            reason = f"config error: {cfg}"
        elif in_process:
            reason = _train_here(cfg, run.workdir, overwrite=run.name in replace)
        else:
            reason = _train_subprocess(run, overwrite=run.name in replace)
        seconds = time.perf_counter() - t0
        if reason is None:
            durations[run.method].append(seconds)
            with open(os.path.join(run.workdir, "results.json")) as f:
                result = json.load(f)
            say(f"{head}: finished in {_clock(seconds)}, test accuracy "
                f"{result['test_accuracy']:.4f}" + _eta(runs[index:], durations))
            log.append({**entry, "status": "finished", "seconds": seconds})
        else:
            _record_failure(run, cfg, reason)
            say(f"{head}: FAILED ({reason.splitlines()[0][:300]})"
                + _eta(runs[index:], durations))
            log.append({**entry, "status": "failed", "seconds": seconds, "reason": reason})
    table = write_tables(workdir, say=say)
    with open(os.path.join(workdir, SWEEP_JSON), "w") as f:
        json.dump({"config": config, "methods": list(methods), "seeds": list(seeds),
                   "overrides": list(overrides), "runs": log}, f, indent=2)
    done = sum(e["status"] != "failed" for e in log)
    say(f"sweep: {done} of {len(runs)} runs finished ({len(runs) - done} failed) in "
        f"{_clock(time.perf_counter() - started)}")
    return {"runs": log, "table": table}


def write_tables(workdir: str, *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Writes ``table.md``, ``table.json`` and the plot of every run folder in ``workdir``.

    Exactly what ``spectral-jax table DIR --json DIR/table.json --plot
    DIR/accuracy_vs_throughput.png`` writes; folders of unfinished runs are left out. Without
    matplotlib the plot is skipped with one line saying what to install.

    Returns:
        The ``table.json`` contents.

    Example:
        >>> # write_tables("runs/image_sweep")
    """
    from spectral_jax.lra.train import table as table_lib

    results = table_lib.load_results(table_lib.run_folders(workdir))
    if not results:
        say("sweep: no finished or failed runs to tabulate")
        return {}
    text = table_lib.markdown_table(results)
    summary = table_lib.summary_json(results)
    written = table_lib.write_outputs(text, summary, os.path.join(workdir, TABLE_MD),
                                      os.path.join(workdir, TABLE_JSON),
                                      os.path.join(workdir, PLOT_PNG))
    say(text)
    say(f"wrote {', '.join(written)}")
    return summary


def _load(run: SweepRun):
    from spectral_jax.lra.train.overrides import load_config

    return load_config(run.config_spec, list(run.overrides))


def _train_here(config, workdir: str, *, overwrite: bool) -> str | None:
    """Trains in this process; returns None on success, else the failure's reason."""
    from spectral_jax.lra.train import TrainingDiverged, train_and_evaluate

    try:
        train_and_evaluate(config, workdir, overwrite=overwrite)
    except TrainingDiverged as e:
        return f"diverged: {e}"
    except (UsageError, FileNotFoundError) as e:
        return f"config error: {type(e).__name__}: {e}"
    except Exception as e:  # e.g. XLA out of memory: it fails one run, not the sweep
        return f"crashed: {type(e).__name__}: {e}"
    return None


def _train_subprocess(run: SweepRun, *, overwrite: bool) -> str | None:
    """Runs ``spectral-jax train`` for ``run``, teeing its output to ``train.log`` and stdout."""
    os.makedirs(run.workdir, exist_ok=True)
    command = [sys.executable, "-m", "spectral_jax.lra.cli", "train", "--config", run.config_spec,
               "--workdir", run.workdir, *(f"--config.{o}" for o in run.overrides)]
    if overwrite:
        command.append("--overwrite")
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with open(os.path.join(run.workdir, LOG_FILE), "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        # Unbuffered: the run's lines reach the sweep's output as they are printed. In its own
        # session, a terminal's Ctrl-C reaches the sweep alone, which forwards it once.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, bufsize=1, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            with forward_signals(process) as stop:
                for line in process.stdout:
                    log.write(line)
                    tail.append(line.rstrip("\n"))
                    sys.stdout.write(f"    {line}")
                    sys.stdout.flush()
                code = process.wait()
        except BaseException:
            # Whatever stops the sweep must not leave its run training in the background.
            process.terminate()
            process.wait()
            raise
    if stop.signum is not None:
        saved = "its checkpoint is saved" if code == 128 + stop.signum else f"exit status {code}"
        raise Interrupted(f"sweep interrupted during {run.name} ({saved}); rerun the same "
                          "command to resume", stop.signum)
    return failure_reason(code, list(tail))


def failure_reason(code: int, output: list[str]) -> str | None:
    """Why ``spectral-jax train`` exited with ``code``, from the last lines of its output.

    The train command exits 1 when the loss diverged, 2 on a config or data error (printing
    ``error: ...`` for both); an uncaught exception also exits 1 with a traceback; 130 and 143
    mean SIGINT or SIGTERM stopped it after a checkpoint; a negative code is the signal that
    killed it.

    Returns:
        None for code 0, else ``"<kind> (exit status N): <last error line>"``.

    Example:
        >>> failure_reason(2, ["...", "error: train.steps=0 must be a positive int"])
        'config error (exit status 2): error: train.steps=0 must be a positive int'
        >>> failure_reason(-9, ["step 10: loss 2.3"])[:60]
        'killed by signal 9 (SIGKILL: often the out-of-memory killer)'
    """
    if code == 0:
        return None
    errors = [line for line in output if line.startswith("error:")]
    detail = errors[-1] if errors else next((x for x in reversed(output) if x.strip()), "")
    if code < 0:
        hint = " (SIGKILL: often the out-of-memory killer)" if code == -9 else ""
        return f"killed by signal {-code}{hint}; last output: {detail}"
    kind = {1: "diverged" if "NaN or inf" in detail else "crashed", 2: "config error",
            # A signal sent to the run itself: it saved, and the next sweep resumes it.
            **{128 + s: "interrupted" for s in (signal.SIGINT, signal.SIGTERM)}}
    return f"{kind.get(code, 'crashed')} (exit status {code}): {detail}"


def _record_failure(run: SweepRun, config, reason: str) -> None:
    os.makedirs(run.workdir, exist_ok=True)
    record = {"attention": run.method, "seed": run.seed, "config_spec": run.config_spec,
              "overrides": list(run.overrides), "reason": reason}
    if not isinstance(config, Exception):
        record.update(task=config.task, protocol=config.protocol)
    from spectral_jax.lra.train.table import FAILED_FILE

    with open(os.path.join(run.workdir, FAILED_FILE), "w") as f:
        json.dump(record, f, indent=2)


def _clear_failure(workdir: str) -> None:
    from spectral_jax.lra.train.table import FAILED_FILE

    path = os.path.join(workdir, FAILED_FILE)
    if os.path.exists(path):
        os.remove(path)


def _eta(remaining: list[SweepRun], durations: dict[str, list[float]]) -> str:
    """An estimate of the time left: each remaining run at its method's mean so far."""
    if not remaining:
        return ""
    done = [t for times in durations.values() for t in times]
    if not done:
        return ""
    overall = sum(done) / len(done)
    left = sum(sum(durations[r.method]) / len(durations[r.method]) if durations[r.method]
               else overall for r in remaining)
    return f"; {len(remaining)} runs left, about {_clock(left)} to go"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
