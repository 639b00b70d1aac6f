"""The package as installed: configs found by name, ``python -m spectral_jax``, one version
string, and what the wheel carries (the configs' packages and ``py.typed``).

The end-to-end check (build the wheel, install it in a fresh venv, train from an empty
directory) is ``.ci/check_wheel_install.py``, run by ``.ci/run``.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import pytest
import setuptools

import spectral_jax
from spectral_jax import UnknownNameError
from spectral_jax.lra import cli
from spectral_jax.lra.train.overrides import available_configs, config_module, load_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "spectral_jax" / "lra" / "configs"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_config_file_is_a_shipped_name():
    files = sorted(f"{p.parent.name}/{p.stem}" for p in CONFIGS.glob("*/*.py")
                   if not p.name.startswith("_"))
    assert available_configs() == files
    # Each LRA task has its config under its own name.
    lra = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
    assert {f"lra/{task}" for task in lra} <= set(available_configs())


@pytest.mark.parametrize("name", [n for n in available_configs() if n.startswith("lra/")])
def test_config_by_name_equals_config_by_path(name):
    path = CONFIGS / f"{name}.py"
    for arg in ("", ":quick,attention=nystrom"):
        by_name = load_config(name + arg, ["train.steps=7"]).to_dict()
        assert by_name == load_config(f"{path}{arg}", ["train.steps=7"]).to_dict()
        assert by_name["train"]["steps"] == 7
    assert pathlib.Path(config_module(name).__file__) == path


def test_a_config_file_outside_the_package_is_loaded_by_path(tmp_path, monkeypatch):
    # A copy under the shipped name's own path: the file wins over the name.
    (tmp_path / "lra").mkdir()
    mine = tmp_path / "lra" / "listops"
    mine.write_text((CONFIGS / "lra" / "listops.py").read_text()
                    .replace('"steps": 3500', '"steps": 123'))
    monkeypatch.chdir(tmp_path)
    assert load_config("lra/listops:quick").train.steps == 123
    assert load_config(str(CONFIGS / "lra" / "listops.py") + ":quick").train.steps == 3500


def test_an_unknown_name_lists_the_shipped_configs():
    with pytest.raises(UnknownNameError) as info:
        load_config("lra/listop:quick")
    message = str(info.value)
    assert message.startswith("--config 'lra/listop:quick': 'lra/listop' is neither a config "
                              "file nor a shipped config; shipped configs: ")
    assert message.endswith(", ".join(available_configs()))


def test_a_missing_file_names_the_shipped_config_it_meant(capsys):
    with pytest.raises(FileNotFoundError, match=r"no config file at 'configs/lra/text.py'; the "
                                                r"shipped config is --config lra/text \("):
        load_config("configs/lra/text.py:quick")
    assert cli.main(["config", "lra/nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spectral-jax config: error: --config 'lra/nope'")


def _run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_python_m_spectral_jax_is_the_cli_and_help_imports_no_jax(tmp_path):
    done = _run("-m", "spectral_jax", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    usage = " ".join(done.stdout.split())
    assert usage.startswith("usage: spectral-jax [-h] {train,config,eval,table,sweep,data,bench")
    # The same entry run in-process, to see what it imported.
    script = ("import runpy, sys\nsys.argv = ['spectral_jax', '--help']\n"
              "try:\n    runpy.run_module('spectral_jax', run_name='__main__')\n"
              "except SystemExit as e:\n    assert e.code == 0, e.code\n"
              "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax', 'orbax')"
              " if m in sys.modules))\n")
    done = _run("-c", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_version_string_is_single_sourced():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "spectral_jax.__version__"}
    assert importlib.metadata.version("spectral_jax") == spectral_jax.__version__
    # No second copy of the string in the package's sources.
    copies = [p for p in (ROOT / "spectral_jax").rglob("*.py")
              if spectral_jax.__version__ in p.read_text()]
    assert copies == [ROOT / "spectral_jax" / "__init__.py"]


def test_the_wheel_carries_every_module_the_configs_and_py_typed():
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = set(setuptools.find_packages(str(ROOT), include=include))
    # A folder of modules without __init__.py would be left out of the wheel.
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "spectral_jax").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders <= packages
    assert {"spectral_jax.lra.configs", "spectral_jax.lra.configs.lra",
            "spectral_jax.lra.configs.lm"} <= packages
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["spectral_jax"]
    assert (ROOT / "spectral_jax" / "py.typed").is_file()
    assert PYPROJECT["project"]["scripts"] == {"spectral-jax": "spectral_jax.lra.cli:main"}


def test_no_top_level_configs_folder_is_left():
    # The configs live in the package only; a stray copy would drift from it.
    assert not (ROOT / "configs").exists()
