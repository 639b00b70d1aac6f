"""The library (attention, nn, linen) stands apart from the LRA harness (spectral_jax.lra)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import spectral_jax

ROOT = pathlib.Path(spectral_jax.__file__).parent
# ``python -m spectral_jax`` runs the harness's CLI: ``__main__`` is the command's entry point,
# never imported by ``import spectral_jax``, so it stands with the harness.
LIBRARY = [p for p in ROOT.rglob("*.py")
           if "lra" not in p.relative_to(ROOT).parts and p != ROOT / "__main__.py"]


def _imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_file_imports_the_harness():
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _imported_modules(p)
                                                  if m.startswith("spectral_jax.lra"))
                 for p in LIBRARY}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(LIBRARY) > 30  # the walk found the library


def test_importing_the_library_loads_no_harness_dependency():
    code = ("import sys, spectral_jax.attention, spectral_jax.nn, spectral_jax.linen; "
            "print(sorted(m for m in sys.modules if m.startswith(('spectral_jax.lra', "
            "'ml_collections', 'PIL'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    assert done.stdout.strip() == "[]"


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    import importlib.metadata

    import pytest

    from spectral_jax import lra
    from spectral_jax.lra import cli

    real = importlib.metadata.distribution

    def fake(name):
        if name == "ml-collections":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    assert lra.missing_dependencies() == ["ml-collections"]
    with pytest.raises(ModuleNotFoundError, match=r"needs ml-collections: install the harness "
                                                  r"with pip install 'spectral_jax\[lra\]'"):
        lra.require()
    assert cli.main(["table", "x"]) == 2
