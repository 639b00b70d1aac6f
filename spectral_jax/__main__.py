"""``python -m spectral_jax``: the ``spectral-jax`` command (:mod:`spectral_jax.lra.cli`).

``python -m spectral_jax train --config lra/listops:quick --workdir runs/q`` is
``spectral-jax train ...``; ``--help`` imports no JAX. Without the ``lra`` extra it prints
one line naming the extra and exits with status 2.
"""

import sys

from spectral_jax.lra.cli import main

if __name__ == "__main__":
    sys.exit(main())
