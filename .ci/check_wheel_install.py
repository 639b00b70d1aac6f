"""Checks the package as a user gets it: built, pip-installed (not editable), run elsewhere.

    python .ci/check_wheel_install.py [--keep]

Builds the sdist and the wheel with ``python -m build`` (the wheel from the sdist, so both
must carry everything), checks the wheel's contents (the shipped configs, ``py.typed``, the
version), installs the wheel with the ``lra`` extra in a fresh venv, and from an empty
temporary directory outside the repository trains a few steps by config name
(``python -m spectral_jax train --config lra/listops:quick``, the data generated there), then
checks ``results.json``. Exits 1 with a message on the first failed check. Everything is
written under one temporary directory, removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 12
# A small generated ListOps (the quick preset's generator, fewer and shorter examples) and a
# short run: what is checked is that the installed package trains, not what it learns.
OVERRIDES = [
    f"--config.train.steps={STEPS}", "--config.train.log_every=4",
    f"--config.train.eval_every={STEPS}", "--config.train.eval_steps=2",
    "--config.train.batch_size=16",
    "--config.data.generate.num_train=256", "--config.data.generate.num_val=32",
    "--config.data.generate.num_test=32", "--config.data.generate.max_length=64",
    "--config.data.options.max_length=64", "--config.model.max_length=64",
    "--config.model.num_layers=1",
]


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def run(command: list[str], cwd: pathlib.Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    check(done.returncode == 0, f"{' '.join(command)} (in {cwd}) exited {done.returncode}:\n"
                                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def repository_version() -> str:
    tree = ast.parse((ROOT / "spectral_jax" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise CheckFailed("spectral_jax/__init__.py defines no __version__")


def check_wheel(wheel: pathlib.Path, version: str) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = sorted(p.relative_to(ROOT).as_posix()
                     for p in (ROOT / "spectral_jax" / "lra" / "configs").rglob("*.py"))
    missing = [n for n in [*configs, "spectral_jax/py.typed", "spectral_jax/__main__.py"]
               if n not in names]
    check(not missing, f"{wheel.name} lacks {missing}")
    check(wheel.name.startswith(f"spectral_jax-{version}-"),
          f"{wheel.name}: expected version {version} (spectral_jax.__version__)")
    stray = sorted(n for n in names if not n.startswith(("spectral_jax/", "spectral_jax-")))
    check(not stray, f"{wheel.name} carries files outside the package: {stray[:10]}")


def check_results(workdir: pathlib.Path, rundir: pathlib.Path) -> dict:
    results_file = workdir / "results.json"
    check(results_file.is_file(), f"no {results_file}")
    results = json.loads(results_file.read_text())
    expected = {"task": "listops", "protocol": "quick", "attention": "spectral_shift",
                "steps": STEPS, "test_examples": 32}
    got = {key: results.get(key) for key in expected}
    check(got == expected, f"results.json has {got}; expected {expected}")
    for key in ("test_accuracy", "final_test_accuracy", "majority_baseline"):
        check(0.0 <= results[key] <= 1.0, f"results.json {key}={results[key]!r}")
    check(math.isfinite(results["test_loss"]), f"test_loss={results['test_loss']!r}")
    data_dir = rundir / "data" / "listops_quick"
    check((data_dir / "generated.json").is_file(), f"the data was not generated in {data_dir}")
    check(str(data_dir) in results["data_source"],
          f"data_source={results['data_source']!r}: expected the data in {data_dir}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    start = time.monotonic()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="spectral_jax_wheel_"))
    check(not tmp.resolve().is_relative_to(ROOT), f"{tmp} is inside the repository")
    # Nothing of the checkout may leak into the installed package's runs.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    try:
        version = repository_version()
        dist = tmp / "dist"
        run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], tmp, env)
        wheels = sorted(dist.glob("*.whl"))
        check(len(wheels) == 1 and len(list(dist.glob("*.tar.gz"))) == 1,
              f"python -m build made {sorted(p.name for p in dist.iterdir())}")
        check_wheel(wheels[0], version)
        built = time.monotonic()

        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", str(venv)], tmp, env)
        python = str(venv / "bin" / "python")
        run([python, "-m", "pip", "install", "-q", f"{wheels[0]}[lra]"], tmp, env)
        installed = time.monotonic()

        rundir = tmp / "run"
        rundir.mkdir()
        where = run([python, "-c", "import importlib.metadata as m, spectral_jax; "
                     "print(spectral_jax.__file__); print(m.version('spectral_jax'))"],
                    rundir, env).split()
        check(pathlib.Path(where[0]).is_relative_to(venv),
              f"spectral_jax imported from {where[0]}, not from the venv")
        check(where[1] == version, f"installed version {where[1]}; expected {version}")
        help_text = run([str(venv / "bin" / "spectral-jax"), "--help"], rundir, env)
        check(help_text.startswith("usage: spectral-jax"), "spectral-jax --help printed no usage")
        workdir = rundir / "runs" / "listops"
        run([python, "-m", "spectral_jax", "train", "--config", "lra/listops:quick",
             "--workdir", str(workdir), *OVERRIDES], rundir, env)
        results = check_results(workdir, rundir)
        end = time.monotonic()
    except CheckFailed as failure:
        print(f"check_wheel_install: FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"check_wheel_install: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"check_wheel_install: ok: {wheels[0].name} built in {built - start:.0f} s, installed "
          f"with [lra] in {installed - built:.0f} s; {STEPS} steps of lra/listops:quick from "
          f"an empty directory in {end - installed:.0f} s (test accuracy "
          f"{results['test_accuracy']:.3f}); {end - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
