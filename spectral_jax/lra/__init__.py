"""The Long Range Arena harness: data, training, sweeps, tables, benchmarks and the CLI.

It sits beside the library (:mod:`spectral_jax.attention`, :mod:`spectral_jax.nn`,
:mod:`spectral_jax.linen`) and uses only their public names; the library never imports it.
Its dependencies come with the ``lra`` extra, ``pip install 'spectral_jax[lra]'``; without
them, importing a subpackage raises one :class:`ModuleNotFoundError` naming that extra and
the ``spectral-jax`` command prints that line and exits with status 2.

Subpackages: :mod:`~spectral_jax.lra.data` (task readers and generators),
:mod:`~spectral_jax.lra.train` (``train_and_evaluate``, sweeps, tables),
:mod:`~spectral_jax.lra.bench` (speed, memory and error benchmarks) and
:mod:`~spectral_jax.lra.cli` (the ``spectral-jax`` command).
"""

from __future__ import annotations

import importlib.metadata

INSTALL_HINT = "pip install 'spectral_jax[lra]'"

_REQUIRED = ("ml-collections", "optax", "orbax-checkpoint", "rich", "pillow")


def missing_dependencies() -> list[str]:
    """The distributions of the ``lra`` extra that are not installed (read without importing).

    Example:
      >>> missing_dependencies()
      []
    """
    missing = []
    for dist in _REQUIRED:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    return missing


def require() -> None:
    """Raises :class:`ModuleNotFoundError` naming the ``lra`` extra if any of it is missing.

    Example:
      >>> require()
    """
    if missing := missing_dependencies():
        raise ModuleNotFoundError(
            f"spectral_jax.lra needs {', '.join(missing)}: install the harness with "
            f"{INSTALL_HINT}")
