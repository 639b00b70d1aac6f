"""``python -m spectral_jax.lra.cli``: the ``spectral-jax`` command (a sweep starts its runs so)."""

import sys

from spectral_jax.lra.cli import main

sys.exit(main())
