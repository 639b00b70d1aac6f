"""`bench speed`: forward and forward+backward time and compiled peak memory per method.

Everything is compiled first and its memory read from ``memory_analysis()``; only the
configurations that fit in the memory budget are then run, so an exact attention that would
exhaust memory is skipped with a note instead of killing the process.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UsageError
from spectral_jax.attention import (
    BASELINE,
    available_attentions,
    budget_parameters,
    get_attention_spec,
)
from spectral_jax.lra.bench import methods as methods_lib
from spectral_jax.lra.bench.memory import (
    default_memory_budget_bytes,
    minor_page_faults,
    peak_bytes,
)
from spectral_jax.lra.compiled import compiled_cost

Array = jax.Array

MODES = ("fwd", "fwd_bwd")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
EXACT = BASELINE
# `jax.nn.dot_product_attention` backends that can be timed next to the methods, as
# "softmax[xla]" / "softmax[cudnn]" (cuDNN: fused flash attention, GPU only, 16-bit inputs).
EXACT_IMPLEMENTATIONS = ("xla", "cudnn")


def benchmark_function(
    name: str, mode: str, budget: int | None, head_chunk_size: int | None = None,
    implementation: str | None = None,
) -> Callable[..., Any]:
    """The function ``bench speed`` times: forward, or forward + gradient w.r.t. q, k, v.

    Args:
      name: a registered method name.
      mode: ``"fwd"`` or ``"fwd_bwd"``.
      budget: num_landmarks for landmark methods; other budgets live in the state.
      head_chunk_size: passed to every method but exact softmax (None: the method's default,
        which depends on the backend).
      implementation: exact softmax only: ``jax.nn.dot_product_attention``'s backend
        (``"xla"``, ``"cudnn"``; None lets JAX choose).

    Returns:
      ``f(query, key, value, state)``; for ``"fwd_bwd"`` it returns the three gradients of
      the float32 sum of the output.

    Raises:
      spectral_jax.UsageError: unknown ``name`` or ``mode``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from spectral_jax.lra.bench.speed import benchmark_function
      >>> x = jnp.ones((1, 16, 2, 8))
      >>> [g.shape for g in benchmark_function("linear", "fwd_bwd", None)(x, x, x, {})]
      [(1, 16, 2, 8), (1, 16, 2, 8), (1, 16, 2, 8)]
    """
    if mode not in MODES:
        raise UsageError(f"`mode` must be one of {MODES}; got {mode!r}.")
    takes_chunks = "head_chunk_size" in inspect.signature(get_attention_spec(name).fn).parameters
    static = {} if not takes_chunks or head_chunk_size is None else {
        "head_chunk_size": head_chunk_size}
    if implementation is not None:
        if name != EXACT or implementation not in EXACT_IMPLEMENTATIONS:
            raise UsageError(f"`implementation` {implementation!r} applies to {EXACT!r} only and "
                             f"must be one of {EXACT_IMPLEMENTATIONS}; got it for {name!r}.")
        static["implementation"] = implementation
    fn = methods_lib.bind(name, budget, **static)
    if mode == "fwd":
        return fn

    def loss(query: Array, key: Array, value: Array, state: dict[str, Array]) -> Array:
        return jnp.sum(fn(query, key, value, state).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def _budget(name: str, budgets: dict[str, int]) -> int | None:
    """The budget ``name`` runs at: the given value of its parameter, else its default."""
    spec = get_attention_spec(name)
    if spec.budget is None:
        return None
    return budgets.get(spec.budget, spec.default(spec.budget))


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"`{name}` must be a positive int; got {value!r}.")


def run_speed(
    *,
    methods: Sequence[str] | None = None,
    lengths: Sequence[int] = (1024, 2048, 4096, 8192, 16384),
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 64,
    dtype: str = "float32",
    repeats: int = 5,
    warmup: int = 1,
    memory_budget_bytes: int | None = None,
    modes: Sequence[str] = MODES,
    head_chunk_size: int | None = None,
    exact_implementations: Sequence[str] = (),
    run: bool = True,
    cost_analysis: bool = False,
    progress: Callable[[str], None] | None = None,
    **budgets: int,
) -> list[dict[str, Any]]:
    """Compiles every (length, method, mode), reads its peak memory, then times what fits.

    Exact attention (``"softmax"``, i.e. ``jax.nn.dot_product_attention``) is always included
    so that ratios can be formed. Timing: ``warmup`` untimed calls, then the median wall time
    of ``repeats`` calls, each ended by ``block_until_ready``.

    Args:
      methods: registered names; default all of them. ``"softmax"`` is added if absent.
      lengths: sequence lengths n.
      batch, heads, head_dim: input layout ``(batch, n, heads, head_dim)``.
      dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (inputs and outputs).
      repeats: timed calls per configuration (≥ 1).
      warmup: untimed calls first (≥ 0).
      memory_budget_bytes: skip configurations whose compiled peak exceeds it; default
        :func:`default_memory_budget_bytes`.
      modes: subset of ``MODES``.
      head_chunk_size: (example, head) slices per step for the approximate methods; None
        uses each method's default (about 4096 tokens' worth per step on CPU for long inputs,
        else all at once).
      exact_implementations: also time exact attention with these
        ``jax.nn.dot_product_attention`` backends (``EXACT_IMPLEMENTATIONS``), recorded as
        methods ``"softmax[xla]"`` / ``"softmax[cudnn]"``; one that does not compile here
        (cuDNN without a GPU, or with float32) is skipped with the reason.
      run: if False only compile and read memory (no timing); used by tests and dry runs.
      cost_analysis: also record XLA's operation count, which no load on the machine
        changes (see :func:`slice_cost`); one more compile per configuration.
      progress: called with one line per event (skips included).
      **budgets: a value per budget parameter of the registry (see
        :func:`spectral_jax.attention.budget_parameters`, e.g. ``num_landmarks=64``); a
        method whose parameter is not given runs at its registry default.

    Returns:
      Records ``{"method", "length", "mode", "peak_bytes", "temp_bytes", "time_s" (median,
      seconds, None if not run), "times_s", "skipped" (None or the reason), "budget",
      "compile_s", "minor_faults_per_call", "gflop", "gbyte"}``: ``minor_faults_per_call``
      is the process's minor page faults per timed call (None if not run, or without the
      ``resource`` module); ``gflop``/``gbyte`` come from :func:`slice_cost` (None unless
      ``cost_analysis``).

    Raises:
      spectral_jax.UsageError: unknown method, mode, dtype or budget parameter; non-positive sizes,
        repeats or budget.

    Example:
      >>> from spectral_jax.lra.bench.speed import run_speed
      >>> recs = run_speed(methods=["linear"], lengths=[64], heads=1, head_dim=8,
      ...                  repeats=1, modes=["fwd"])
      >>> sorted(r["method"] for r in recs)
      ['linear', 'softmax']
    """
    methods = methods_lib.check_methods(methods or available_attentions())
    if EXACT not in methods:
        methods = (EXACT, *methods)
    if dtype not in DTYPES:
        raise UsageError(f"`dtype` must be one of {tuple(DTYPES)}; got {dtype!r}.")
    for mode in modes:
        if mode not in MODES:
            raise UsageError(f"`modes`: {mode!r} is not one of {MODES}.")
    lengths = tuple(lengths)
    if not lengths:
        raise UsageError("`lengths` is empty; give at least one sequence length.")
    if len(set(lengths)) != len(lengths):
        raise UsageError(f"`lengths` must be distinct; got {list(lengths)}.")
    known = budget_parameters()
    for name in budgets:
        if name not in known:
            raise UsageError(f"`{name}` is not a budget parameter; known: {sorted(known)}.")
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim),
                        *budgets.items(), ("repeats", repeats),
                        *((f"lengths[{i}]", n) for i, n in enumerate(lengths))):
        _check_positive(name, value)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise UsageError(f"`warmup` must be an int >= 0; got {warmup!r}.")
    if head_chunk_size is not None:
        _check_positive("head_chunk_size", head_chunk_size)
    exact_implementations = tuple(dict.fromkeys(exact_implementations))
    for impl in exact_implementations:
        if impl not in EXACT_IMPLEMENTATIONS:
            raise UsageError(f"`exact_implementations`: {impl!r} is not one of "
                             f"{EXACT_IMPLEMENTATIONS}.")
    entries = [(name, None) for name in methods] + [(EXACT, i) for i in exact_implementations]
    if memory_budget_bytes is None:
        memory_budget_bytes = default_memory_budget_bytes()
    _check_positive("memory_budget_bytes", memory_budget_bytes)
    say = progress or (lambda message: None)
    jdtype = DTYPES[dtype]

    # Phase 1: compile everything and read memory; nothing has been executed yet.
    plan: list[tuple[dict[str, Any], jax.stages.Compiled | None, dict[str, Array]]] = []
    for n in lengths:
        spec = jax.ShapeDtypeStruct((batch, n, heads, head_dim), jdtype)
        for name, impl in entries:
            label = name if impl is None else f"{name}[{impl}]"
            budget = _budget(name, budgets)
            state = methods_lib.make_state(name, jax.random.key(0), budget=budget, length=n,
                                           head_dim=head_dim)
            state_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
            # A backend JAX cannot use here fails in its own way (cuDNN: RuntimeError or
            # NotImplementedError); the methods' own failures are ValueErrors.
            expected = ValueError if impl is None else (ValueError, RuntimeError,
                                                        NotImplementedError, TypeError)
            for mode in modes:
                record: dict[str, Any] = {
                    "method": label, "length": n, "mode": mode, "budget": budget,
                    "peak_bytes": None, "temp_bytes": None, "time_s": None, "times_s": [],
                    "skipped": None, "compile_s": None, "minor_faults_per_call": None,
                    "gflop": None, "gbyte": None,
                }
                start = time.perf_counter()
                try:
                    compiled = jax.jit(benchmark_function(
                        name, mode, budget, head_chunk_size, impl)).lower(
                        spec, spec, spec, state_spec).compile()
                except expected as err:  # e.g. a budget larger than this length allows
                    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
                    record["skipped"] = (f"does not compile at n={n}: "
                                         f"{type(err).__name__}: {first_line[:300]}")
                    say(f"skip {label} {mode} n={n}: {record['skipped']}")
                    plan.append((record, None, state))
                    continue
                record["compile_s"] = time.perf_counter() - start
                if cost_analysis:
                    record["gflop"], record["gbyte"] = slice_cost(
                        name, mode, budget, impl, length=n, head_dim=head_dim, dtype=jdtype,
                        slices=batch * heads)
                record["peak_bytes"] = peak_bytes(compiled)
                record["temp_bytes"] = int(compiled.memory_analysis().temp_size_in_bytes)
                if record["peak_bytes"] > memory_budget_bytes:
                    record["skipped"] = (
                        f"needs {record['peak_bytes'] / 2**30:.2f} GiB > budget "
                        f"{memory_budget_bytes / 2**30:.2f} GiB"
                    )
                    say(f"skip {label} {mode} n={n}: {record['skipped']}")
                    compiled = None
                plan.append((record, compiled, state))

    # Phase 2: time what fits.
    records = []
    for record, compiled, state in plan:
        records.append(record)
        if compiled is None or not run:
            continue
        keys = jax.random.split(jax.random.key(record["length"]), 3)
        shape = (batch, record["length"], heads, head_dim)
        q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(jdtype) for key in keys)
        for _ in range(warmup):
            jax.block_until_ready(compiled(q, k, v, state))
        times = []
        faults_before = minor_page_faults()
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(q, k, v, state))
            times.append(time.perf_counter() - start)
        if faults_before is not None:
            record["minor_faults_per_call"] = (minor_page_faults() - faults_before) / repeats
        record["times_s"] = times
        record["time_s"] = statistics.median(times)
        faults = record["minor_faults_per_call"]
        say(f"{record['method']} {record['mode']} n={record['length']}: "
            f"{1e3 * record['time_s']:.2f} ms, peak {record['peak_bytes'] / 2**20:.1f} MiB"
            + ("" if faults is None else f", {faults:.0f} page faults/call"))
        del q, k, v
    return records


def slice_cost(
    name: str, mode: str, budget: int | None, implementation: str | None = None, *,
    length: int, head_dim: int, dtype: Any = jnp.float32, slices: int = 1,
) -> tuple[float, float]:
    """XLA's floating-point operations and bytes accessed, in units of 10⁹, for ``slices``
    (example, head) slices of :func:`benchmark_function`.

    One slice (batch 1, 1 head) is compiled and its ``cost_analysis()`` multiplied by
    ``slices``: that is the program accelerators run (all heads at once, nothing
    rematerialised). XLA counts a loop's body once, so the CPU default, a loop over head
    chunks, would undercount; its rematerialisation adds about one forward pass to
    ``fwd_bwd``. Counts do not depend on the machine's load, which makes them the steady
    ratio to set beside noisy times.

    Example:
      >>> from spectral_jax.lra.bench.speed import slice_cost
      >>> flop, _ = slice_cost("softmax", "fwd", None, length=64, head_dim=8)
      >>> 2 * 2 * 64 * 64 * 8 / 1e9 <= flop < 3 * 2 * 64 * 64 * 8 / 1e9  # QKᵀ and PV
      True
    """
    spec = jax.ShapeDtypeStruct((1, length, 1, head_dim), dtype)
    state = methods_lib.make_state(name, jax.random.key(0), budget=budget, length=length,
                                   head_dim=head_dim)
    state_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    compiled = jax.jit(benchmark_function(name, mode, budget, None, implementation)).lower(
        spec, spec, spec, state_spec).compile()
    flop, byte = compiled_cost(compiled)
    return slices * flop, slices * byte


def add_ratios(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds ratios to exact attention and the growth factor per doubling of length.

    For each record: ``time_ratio`` = time / exact's time and ``memory_ratio`` = peak /
    exact's peak at the same length and mode (None where exact was skipped or not run), and
    ``growth_per_doubling`` = (t(n) / t(n_prev))^(1 / log2(n / n_prev)) against the same
    method and mode at the next shorter measured length (None for the first).

    Args:
      records: output of :func:`run_speed`.

    Returns:
      New records with the three keys added.

    Example:
      >>> from spectral_jax.lra.bench.speed import add_ratios
      >>> recs = [dict(method=m, length=n, mode="fwd", time_s=t, peak_bytes=p)
      ...         for m, n, t, p in [("softmax", 8, 1.0, 4), ("softmax", 16, 4.0, 16),
      ...                            ("linear", 8, 0.5, 2), ("linear", 16, 1.0, 4)]]
      >>> [(r["time_ratio"], r["growth_per_doubling"]) for r in add_ratios(recs)]
      [(1.0, None), (1.0, 4.0), (0.5, None), (0.25, 2.0)]
    """
    by_key = {(r["method"], r["length"], r["mode"]): r for r in records}
    out = []
    for r in records:
        r = dict(r)
        exact = by_key.get((EXACT, r["length"], r["mode"]))
        r["time_ratio"] = r["memory_ratio"] = r["growth_per_doubling"] = None
        if exact is not None and exact.get("time_s") and r.get("time_s"):
            r["time_ratio"] = r["time_s"] / exact["time_s"]
        if exact is not None and exact.get("peak_bytes") and r.get("peak_bytes") is not None:
            r["memory_ratio"] = r["peak_bytes"] / exact["peak_bytes"]
        shorter = [n for (m, n, mode) in by_key if m == r["method"] and mode == r["mode"]
                   and n < r["length"] and by_key[(m, n, mode)].get("time_s")]
        if shorter and r.get("time_s"):
            prev = by_key[(r["method"], max(shorter), r["mode"])]
            octaves = np.log2(r["length"] / prev["length"])
            r["growth_per_doubling"] = float((r["time_s"] / prev["time_s"]) ** (1 / octaves))
        out.append(r)
    return out
