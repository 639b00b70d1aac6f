"""Test configuration: 8 simulated CPU devices, one place for JAX settings."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

# Must run before the backend starts, i.e. before any device query or array creation.
jax.config.update("jax_num_cpu_devices", 8)
# The tests compile thousands of small programs whose run time is negligible: XLA's
# optimisation passes cost more than they save (about 30% of the suite's CPU time). The
# semantics are unchanged; benchmarks and training runs keep the optimisations.
jax.config.update("jax_disable_most_optimizations", True)


def pytest_configure(config):
    # pytest-xdist stops its workers with an interrupt; when it lands inside JAX's garbage
    # collection callback, Python reports it as "Exception ignored in _xla_gc_callback" and
    # pytest turns that into a warning at the end of an otherwise green run. It says nothing
    # about the tests, so only that exact report is silenced.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Exception ignored in. <function (.*\\.)?_xla_gc_callback "
        ":pytest.PytestUnraisableExceptionWarning",
    )
