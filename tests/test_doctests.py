"""The docstring examples of every module of the library and the harness run as tests.

One test per module, found with ``pkgutil.walk_packages``, so a new module is covered
without editing this file. Private modules (``_nystrom`` and the like) hold the docstrings
of the public functions they define, so they are included too. Examples use small shapes,
and the attention methods' examples share one, ``(2, 128, 4, 16)``: an eager call compiles
each primitive once per shape and process, so examples on one shape reuse each other's.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import spectral_jax

# The layers a user meets by name: each must be found by the walk below.
PUBLIC_PACKAGES = ("spectral_jax.attention", "spectral_jax.nn", "spectral_jax.linen",
                   "spectral_jax.lra", "spectral_jax.lra.bench", "spectral_jax.lra.cli",
                   "spectral_jax.lra.data", "spectral_jax.lra.train")


def _modules() -> list[str]:
    found = pkgutil.walk_packages(spectral_jax.__path__, "spectral_jax.")
    # `__main__` modules run a program when imported; their logic lives in importable modules.
    return ["spectral_jax"] + sorted(m.name for m in found if not m.name.endswith(".__main__"))


MODULES = _modules()


def test_every_public_package_is_walked():
    assert set(PUBLIC_PACKAGES) <= set(MODULES)
    # Every module under a public package is collected, not only the package itself.
    assert {"spectral_jax.attention.landmark._nystrom", "spectral_jax.lra.bench.speed",
            "spectral_jax.lra.train.steps", "spectral_jax.lra.plotting"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    # Examples that write files write them here; configs are found by name
    # ("lra/listops:quick"), from any directory.
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
