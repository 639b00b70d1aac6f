"""Test configuration: 8 simulated CPU devices, one place for JAX settings, the `unit` subset.

Compiled programs are shared through JAX's persistent compilation cache: the cache key is
the program itself, not the Python function, so every test that builds the same program
again (a fresh module, a re-created closure, the other xdist worker, a CLI subprocess)
loads it instead of compiling it. The controller creates one directory per session and
hands it to the workers through the environment; a ``JAX_COMPILATION_CACHE_DIR`` already
set is used as given (kept across sessions).
"""

import fnmatch
import os
import pathlib
import shutil
import tempfile

import pytest
from suite_split import full_suite_only

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Workers (and subprocesses) inherit the controller's environment, so the first process to
# import this file decides the directory for the whole session.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="spectral_jax_tests_jit_")
    os.environ["SPECTRAL_JAX_TESTS_OWN_CACHE"] = str(os.getpid())
# Every program is worth caching: the tests' programs are small and compile in milliseconds.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# XLA:CPU's fusion emitters spend most of a test's compile in LLVM, one module per fused
# kernel; the classic emitters compile and first-run the same programs about twice as fast,
# and one LLVM module per program (no split into parts compiled on a thread pool) saves
# about a sixth more on these small programs (`benchmarks/cpu_compile_emitters.md`), with
# the same semantics. Set in the environment before JAX starts, so the workers and the CLI
# subprocesses of the tests inherit it.
_FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false "
                       "--xla_cpu_parallel_codegen_split_count=1")
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE_FLAGS}".strip()

import jax  # noqa: E402  (after the environment above, which JAX reads on import)

# Must run before the backend starts, i.e. before any device query or array creation.
jax.config.update("jax_num_cpu_devices", 8)
# The tests compile thousands of small programs whose run time is negligible: XLA's
# optimisation passes cost more than they save. The semantics are unchanged; benchmarks
# and training runs keep the optimisations.
jax.config.update("jax_disable_most_optimizations", True)

# Fast tests of one subject each (no training run, no method-by-method sweep of the
# registry), for quick feedback: `python -m pytest -m unit -n 2`. Matched by file name,
# so a new file of one of these subjects joins the subset without an edit here.
UNIT_FILES = (
    "test_data_*.py",
    "test_bench_delta_forms.py",
    "test_bench_report.py",
    "test_configs_lra.py",
    "test_attention_kwargs_form.py",
    "test_layers.py",
    "test_nn_inputs.py",
    "test_plots_optional.py",
    "test_readme.py",
    "test_registry_complete.py",
    "test_table_cli.py",
)


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


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if full_suite_only(item.originalname, callspec.params if callspec else {}):
            item.add_marker(pytest.mark.slow)
        name = pathlib.Path(str(item.fspath)).name
        if any(fnmatch.fnmatch(name, p) for p in UNIT_FILES) and "slow" not in item.keywords:
            item.add_marker(pytest.mark.unit)


def pytest_unconfigure(config):
    # Only the process that created the session's directory removes it, after the workers.
    if os.environ.get("SPECTRAL_JAX_TESTS_OWN_CACHE") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
