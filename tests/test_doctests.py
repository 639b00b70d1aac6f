"""The docstring examples of the public packages run as tests (one test per module).

Covers ``spectral_jax.attention``, ``spectral_jax.nn``, ``spectral_jax.lra.data``, the argument
checks and the entry point. Examples use tiny shapes so that the whole file stays fast.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import jax
import pytest

import spectral_jax

PACKAGES = ("spectral_jax.attention", "spectral_jax.nn", "spectral_jax.lra.data")
EXTRA = ("spectral_jax._checks", "spectral_jax.lra", "spectral_jax.lra.compiled",
         "spectral_jax.lra.cli", "spectral_jax.lra.cli.data", "spectral_jax.lra.train.interrupt",
         "spectral_jax.lra.train.extend")


@pytest.fixture(autouse=True, scope="module")
def _fast_compiles():
    # Tiny examples: XLA's optimisation passes cost more than they save (about a quarter of
    # this file's CPU time), and the printed values are the same.
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


def _modules() -> list[str]:
    names = list(EXTRA)
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    return names


def test_every_package_is_covered():
    assert set(PACKAGES) <= {m.name for m in pkgutil.walk_packages(spectral_jax.__path__,
                                                                   "spectral_jax.")}


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
