"""spectral_jax: efficient self-attention for JAX and Flax.

The attention methods are pure functions in :mod:`spectral_jax.attention`; Flax NNX
modules are in :mod:`spectral_jax.nn`, Linen wrappers in :mod:`spectral_jax.linen`,
LRA data in :mod:`spectral_jax.lra.data`, training in :mod:`spectral_jax.lra.train` and
benchmarks in :mod:`spectral_jax.lra.bench`. Every error raised for bad input is a
:class:`UsageError`.
"""

from spectral_jax._checks import (
    UnknownNameError,
    UnsupportedError,
    UsageError,
    UsageTypeError,
)

__all__ = ["UnknownNameError", "UnsupportedError", "UsageError", "UsageTypeError", "__version__"]
# The one version string: pyproject.toml reads it (setuptools `dynamic` version).
__version__ = "0.1.0"
