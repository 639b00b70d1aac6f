"""``bench decode``: per-token decoding time and state size against the context length.

For each causal method and context length n, a decoding state that already holds n tokens
per example (as after a prompt of n tokens) takes ``steps`` more tokens in one jitted
``jax.lax.scan`` of :func:`spectral_jax.attention.decode_step`; the time per token is the
fastest of ``repeats`` runs divided by ``steps`` (the least disturbed by other work on the
machine; the median is recorded too). The state size is the bytes of its arrays
(:attr:`DecodeState.nbytes`). Both are also given as ratios to softmax with a KV cache at
the same n, measured in the same run. The state's values do not change the work, so it is
filled with random numbers rather than by prefilling n tokens.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from rich.table import Table

from spectral_jax.attention import (
    BASELINE,
    DecodeState,
    decode_methods,
    decode_step,
    get_attention_spec,
    init_decode_state,
)
from spectral_jax.lra.bench.report import method_styles
from spectral_jax.lra.plotting import log_length_axes, save_figure, side_by_side


def _kwargs(method: str, *, length: int, heads: int, head_dim: int, batch: int
            ) -> dict[str, Any]:
    """The method's state arguments at its default budget; RFA-Gate's gates per token."""
    spec = get_attention_spec(method)
    kwargs = spec.make_state(jax.random.key(0), budget=None, length=length, head_dim=head_dim)
    if "gates" in kwargs:
        kwargs["gates"] = jnp.full((batch, 1, heads), 0.9, jnp.float32)
    return kwargs


def _filled(method: str, *, context: int, steps: int, batch: int, heads: int, head_dim: int,
            dtype: Any, kwargs: dict[str, Any]) -> DecodeState:
    """A state of ``context`` tokens per example with room for ``steps`` more."""
    init_kwargs = {k: v for k, v in kwargs.items() if k != "gates"}
    state = init_decode_state(method, batch_shape=(batch,), max_length=context + steps,
                              num_heads=heads, head_dim=head_dim, dtype=dtype, **init_kwargs)
    keys = jax.random.split(jax.random.key(1), len(state.arrays))
    arrays = {name: jax.random.uniform(key, a.shape, a.dtype) if a.ndim > 2 else
              jnp.zeros_like(a) for key, (name, a) in zip(keys, sorted(state.arrays.items()))}
    return DecodeState(method, state.max_length, jnp.full((batch,), context, jnp.int32),
                       state.ok, arrays)


def time_decode(method: str, *, context: int, steps: int = 64, batch: int = 1, heads: int = 1,
                head_dim: int = 16, dtype: Any = jnp.float32, repeats: int = 7
                ) -> dict[str, Any]:
    """One record: per-token time (fastest and median of ``repeats``) and state bytes.

    Example:
      >>> r = time_decode("linear", context=64, steps=4, repeats=1)
      >>> r["state_bytes"], r["time_per_token_s"] > 0
      (1088, True)
    """
    kwargs = _kwargs(method, length=context + steps, heads=heads, head_dim=head_dim,
                     batch=batch)
    state = _filled(method, context=context, steps=steps, batch=batch, heads=heads,
                    head_dim=head_dim, dtype=dtype, kwargs=kwargs)
    tokens = jax.random.normal(jax.random.key(2), (3, steps, batch, 1, heads, head_dim), dtype)

    @jax.jit
    def run(state: DecodeState, tokens: jax.Array) -> tuple[DecodeState, jax.Array]:
        def body(state, qkv):
            out, state = decode_step(state, qkv[0], qkv[1], qkv[2], **kwargs)
            return state, out

        return jax.lax.scan(body, state, jnp.moveaxis(tokens, 1, 0))

    compiled = run.lower(state, tokens).compile()
    jax.block_until_ready(compiled(state, tokens))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(state, tokens))
        times.append(time.perf_counter() - start)
    return {"method": method, "decode": get_attention_spec(method).decode, "context": context,
            "steps": steps, "time_per_token_s": min(times) / steps,
            "median_time_per_token_s": statistics.median(times) / steps,
            "state_bytes": state.nbytes}


def run_decode(methods: Sequence[str] | None = None, *, lengths: Sequence[int],
               progress: Callable[[str], Any] = print, **settings: Any) -> list[dict[str, Any]]:
    """:func:`time_decode` for every method and length, softmax first, with ratios to it.

    Adds ``time_ratio`` and ``bytes_ratio`` (method / softmax at the same context).
    """
    methods = list(decode_methods() if methods is None else methods)
    methods = [BASELINE] + [m for m in methods if m != BASELINE]
    records = []
    for context in lengths:
        for method in methods:
            record = time_decode(method, context=context, **settings)
            progress(f"{method:18s} n={context:6d}  {record['time_per_token_s'] * 1e6:9.1f} "
                     f"µs/token  {record['state_bytes'] / 2**10:9.1f} KiB")
            records.append(record)
    base = {r["context"]: r for r in records if r["method"] == BASELINE}
    for r in records:
        b = base[r["context"]]
        r["time_ratio"] = r["time_per_token_s"] / b["time_per_token_s"]
        r["bytes_ratio"] = r["state_bytes"] / b["state_bytes"]
    return records


def decode_table(records: Sequence[dict[str, Any]], title: str = "bench decode") -> Table:
    """Per-token time (µs) and state size (KiB), and both as ratios to softmax."""
    table = Table(title=title)
    for column in ("method", "state", "context", "µs/token", "× softmax", "state KiB",
                   "× softmax "):
        table.add_column(column, justify="left" if column in ("method", "state") else "right")
    for r in records:
        table.add_row(r["method"], r["decode"], str(r["context"]),
                      f"{r['time_per_token_s'] * 1e6:.1f}", f"{r['time_ratio']:.3f}",
                      f"{r['state_bytes'] / 2**10:.1f}", f"{r['bytes_ratio']:.4f}")
    return table


def plot_decode(records: Sequence[dict[str, Any]], path: str | pathlib.Path,
                title: str = "") -> pathlib.Path | None:
    """Log-log per-token time and state size against context length, one line per method.

    Returns the path written, or None when matplotlib is missing.
    """
    path = pathlib.Path(path)
    panels = side_by_side(path)
    if panels is None:
        return None
    fig, ax_t, ax_m = panels
    for method, style in method_styles([r["method"] for r in records]).items():
        pts = sorted((r["context"], r) for r in records if r["method"] == method)
        ax_t.plot([n for n, _ in pts], [r["time_per_token_s"] * 1e6 for _, r in pts],
                  label=method, **style)
        ax_m.plot([n for n, _ in pts], [r["state_bytes"] / 2**10 for _, r in pts],
                  label=method, **style)
    log_length_axes([(ax_t, "decode time per token (µs)"), (ax_m, "state size (KiB)")],
                    xlabel="context length n")
    ax_t.legend(fontsize=8)
    return save_figure(fig, path, title)
