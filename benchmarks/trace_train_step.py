"""How many spectral_jax files one training step runs through, from the CLI to its first log line.

Runs ``spectral-jax train`` in this process on a tiny ListOps config (data generated in a
temporary folder by an untraced warm-up run in a subprocess, so the trace holds training and
not data generation) under ``sys.setprofile``, from the CLI's ``main`` until the first line
of ``metrics.jsonl`` is written, and prints the number of distinct files in which a function
(not module or class bodies run on import) executed, grouped by package, plus the repository's
config files. It also prints the step's call chain: the spectral_jax files on the call stack,
outermost first, when the training step (``train/steps.py``) first calls an attention
function of ``spectral_jax/attention/`` (a ``*_attention`` function such as
``spectral_shift_attention``), i.e. the files a reader follows from the CLI to the attention
call. Last, the registry lookups by name: the calls of ``get_attention_spec`` given a string
(not an entry, which passes through), counted by calling place.

Usage::

    python benchmarks/trace_train_step.py [--list]

Run it from the repository root; ``PYTHONPATH`` picks the checkout to measure.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import subprocess
import sys
import tempfile
import threading


def _arguments(root: str, data_dir: str, workdir: str, steps: int) -> list[str]:
    return [
        "train", "--config", "lra/listops:quick",
        "--workdir", workdir,
        f"--config.data.dir={data_dir}", "--config.data.options.max_length=32",
        "--config.data.generate.num_train=64", "--config.data.generate.num_val=16",
        "--config.data.generate.num_test=16", "--config.data.generate.min_length=8",
        "--config.data.generate.max_length=32", "--config.data.generate.max_depth=3",
        "--config.model.max_length=32", "--config.model.num_layers=1",
        f"--config.train.steps={steps}", "--config.train.batch_size=8",
        "--config.train.log_every=1", f"--config.train.eval_every={steps}",
        "--config.train.eval_steps=1", "--config.train.schedule.warmup_steps=1",
    ]


def _chain(frame, root: str) -> list[str]:
    """The distinct repository files on ``frame``'s stack, outermost first."""
    stack = []
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(root + os.sep) and "site-packages" not in path:
            stack.append(os.path.relpath(path, root))
        frame = frame.f_back
    chain: list[str] = []
    for path in reversed(stack):
        if path not in chain:
            chain.append(path)
    return chain


def trace() -> tuple[dict[str, set[str]], list[str], collections.Counter]:
    """Runs the traced step; returns ``({package: {file, ...}}, call chain, lookups)``.

    The first holds the files where a function ran, the second the files on the stack at the
    step's first call of a ``*_attention`` function in ``spectral_jax/attention/``, the third
    the by-name registry lookups per calling ``file:line``.
    """
    import spectral_jax
    from spectral_jax.attention import _registry

    # The checkout that holds the imported package: its configs are the ones traced.
    package_root = os.path.dirname(os.path.abspath(spectral_jax.__file__))
    root = os.path.dirname(package_root)
    tmp = tempfile.mkdtemp(prefix="trace_train_step_")
    data_dir = os.path.join(tmp, "data")
    warm = subprocess.run(
        [sys.executable, "-c", "import sys; from spectral_jax.lra.cli import main; "
         "sys.exit(main(sys.argv[1:]))", *_arguments(root, data_dir, os.path.join(tmp, "warm"), 1)],
        cwd=root, capture_output=True, text=True)
    if warm.returncode:
        sys.exit(f"the warm-up run failed:\n{warm.stdout}\n{warm.stderr}")

    workdir = os.path.join(tmp, "run")
    metrics = os.path.join(workdir, "metrics.jsonl")
    files: set[str] = set()
    chain: list[str] = []
    done = threading.Event()
    attention_dir = os.path.join(package_root, "attention") + os.sep
    steps_file = os.path.join(package_root, "lra", "train", "steps.py")
    lookup_code = _registry.get_attention_spec.__code__
    lookups: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if done.is_set() or event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if (not path.startswith(root + os.sep) or "site-packages" in path
                or path == os.path.abspath(__file__)):
            return
        # CO_OPTIMIZED marks a function's code; module and class bodies run on import.
        if event == "call" and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            files.add(path)
            if frame.f_code is lookup_code and isinstance(frame.f_locals.get("name"), str):
                caller = frame.f_back
                while caller.f_code.co_filename == path:  # get_attention calls it
                    caller = caller.f_back
                lookups[f"{os.path.relpath(caller.f_code.co_filename, root)}:"
                        f"{caller.f_lineno}"] += 1
            if (not chain and path.startswith(attention_dir)
                    and frame.f_code.co_name.endswith("_attention")):
                outer, in_step = frame.f_back, False
                while outer is not None and not in_step:
                    in_step = outer.f_code.co_filename == steps_file
                    outer = outer.f_back
                if in_step:
                    chain.extend(_chain(frame, root))
        elif event == "return" and os.path.exists(metrics) and os.path.getsize(metrics):
            done.set()
            sys.setprofile(None)
            threading.setprofile(None)

    from spectral_jax.lra.cli import main

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        status = main(_arguments(root, data_dir, workdir, 2))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if status:
        sys.exit(f"the traced run exited with status {status}")
    if not done.is_set():
        sys.exit("no metrics line was written")

    groups: dict[str, set[str]] = collections.defaultdict(set)
    for path in files:
        relative = os.path.relpath(path, root)
        if path.startswith(package_root + os.sep):
            groups[os.path.dirname(relative).replace(os.sep, ".")].add(relative)
        else:
            groups["(repository, outside the package)"].add(relative)
    return groups, chain, lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="also list the files")
    args = parser.parse_args()
    groups, chain, lookups = trace()
    in_package = sum(len(v) for k, v in groups.items() if not k.startswith("("))
    print(f"spectral_jax files in which a function ran: {in_package}")
    for name in sorted(groups):
        print(f"  {name}: {len(groups[name])}")
        if args.list:
            for path in sorted(groups[name]):
                print(f"      {path}")
    print(f"files on the call chain from the CLI to the step's attention call: {len(chain)}")
    for path in chain:
        print(f"  {path}")
    print(f"registry lookups by name: {sum(lookups.values())} calls from {len(lookups)} places")
    for place, count in sorted(lookups.items()):
        print(f"  {place}: {count}")


if __name__ == "__main__":
    main()
