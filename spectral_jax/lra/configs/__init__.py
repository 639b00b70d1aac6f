"""The training configs shipped with the package, found by name: ``lra/listops`` is
``spectral_jax/lra/configs/lra/listops.py`` (``spectral-jax train --config lra/listops:quick``).

Each module defines ``get_config(arg)`` (big_vision style);
:func:`spectral_jax.lra.train.overrides.load_config` resolves a name here and a path to any
other file.
"""
