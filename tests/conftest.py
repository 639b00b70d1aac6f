"""Test configuration: 8 simulated CPU devices, one place for JAX settings."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

# Must run before the backend starts, i.e. before any device query or array creation.
jax.config.update("jax_num_cpu_devices", 8)
