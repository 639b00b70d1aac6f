"""The linear-recurrent family's speed, memory and decode cost, each ratio measured in one run.

For every registered method of the family (``gla``, ``retnet``, ``mamba2``, ``deltanet``,
``gated_deltanet``), forward + backward of ``sum(out * w)`` at each length and head dim:

- the chunked form (the registered function, default chunk size);
- the same recurrence by ``jax.lax.scan`` over tokens (``recurrent_reference``, vmapped over
  batch and heads): the ratio scan / chunked is the chunking's gain;
- exact causal softmax attention (``softmax_attention(is_causal=True)``), the baseline,
  timed once per length and head dim (with the first method's inputs).

Times are medians over ``--repeats`` calls after ``--warmup`` calls, on whatever machine runs
it (CPU here); only the ratios within one run are comparable. Memory is XLA's own count for
the compiled forward + backward (``memory_analysis()``: temporaries plus outputs), which needs
no run, at every ``--memory-lengths`` entry. Decode: the time of one jitted ``decode_step``
and the bytes of its state after prompts of each ``--context`` length.

Usage::

    python benchmarks/recurrent_cpu.py --out benchmarks/recurrent_cpu
    python benchmarks/recurrent_cpu.py --lengths 1024 --head-dims 32 --memory-lengths 1024 \\
        --context 64 --repeats 1 --methods retnet --out /tmp/r   # a quick check
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import attention as sa
from spectral_jax.attention import recurrent as rec

# The registered methods whose decode form is the recurrent state (the family), in order.
FAMILY = tuple(n for n, s in sa.ATTENTIONS.items() if s.decode == "recurrent_state")


def _inputs(method: str, n: int, heads: int, d: int, batch: int = 1):
    spec = sa.get_attention_spec(method)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, w = (jax.random.normal(kk, (batch, n, heads, d)) for kk in ks)
    kwargs = spec.call_kwargs(jax.random.key(1), budget=None, length=n, head_dim=d)
    return q, k, v, w, kwargs


def _scan_form(method: str, kwargs: dict):
    """The method's recurrence by a scan over tokens: the per-token terms the registered
    function would use, then ``recurrent_reference`` per (example, head)."""
    def per_head_terms(q, k, v):
        b, n, h, d = q.shape
        g = jnp.zeros((b, n, h, 1))
        beta = None
        scale = d ** -0.5
        if method == "gla":
            g = jnp.broadcast_to(kwargs["g"], (b, n, h, d))
        elif method == "retnet":
            g = jnp.broadcast_to(rec.retnet_decays(h)[:, None], (b, n, h, 1))
        elif method == "mamba2":
            dt = jnp.broadcast_to(kwargs["dt"], (b, n, h))
            g = (dt * kwargs["A"])[..., None]
            v = v * dt[..., None]
            scale = 1.0
        if method in ("deltanet", "gated_deltanet"):
            beta = jnp.broadcast_to(kwargs["beta"], (b, n, h))
            q, k = (x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6) for x in (q, k))
            if method == "gated_deltanet":
                g = jnp.broadcast_to(kwargs["g"], (b, n, h))[..., None]
        return q, k, v, g, beta, scale

    def run(q, k, v):
        q, k, v, g, beta, scale = per_head_terms(q, k, v)
        n = q.shape[1]
        d_k, d_v = k.shape[-1], v.shape[-1]

        def head(q1, k1, v1, g1, b1):
            out, _ = rec.recurrent_reference(q1[None], k1, v1, g1, b1, jnp.zeros(n, bool),
                                             jnp.zeros((d_k, d_v)), scale=scale)
            return out[0]

        swap = lambda x: None if x is None else jnp.moveaxis(x, 2, 1)  # noqa: E731
        b_axis = None if beta is None else 0
        per_head = jax.vmap(jax.vmap(head, in_axes=(0, 0, 0, 0, b_axis)),
                            in_axes=(0, 0, 0, 0, b_axis))
        out = per_head(swap(q), swap(k), swap(v), swap(g), swap(beta))
        return jnp.moveaxis(out, 1, 2)

    return run


def _forms(method: str, kwargs: dict):
    fn = sa.get_attention(method)
    return {
        "chunked": lambda q, k, v: fn(q, k, v, **kwargs),
        "scan": _scan_form(method, kwargs),
        "softmax": lambda q, k, v: sa.softmax_attention(q, k, v, is_causal=True),
    }


def _loss_grad(form):
    def loss(q, k, v, w):
        return jnp.sum(form(q, k, v) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _median_time(f, args, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _memory_bytes(f, args) -> int:
    stats = f.lower(*args).compile().memory_analysis()
    return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)


def speed(methods, lengths, head_dims, heads, repeats, warmup, forms):
    rows = []
    for d in head_dims:
        for n in lengths:
            baseline: dict[str, float] = {}  # softmax does not depend on the method: timed once
            for method in methods:
                q, k, v, w, kwargs = _inputs(method, n, heads, d)
                row = {"method": method, "n": n, "head_dim": d}
                for name, form in _forms(method, kwargs).items():
                    if name not in forms:
                        continue
                    if name == "softmax" and baseline:
                        row.update(baseline)
                        continue
                    f = _loss_grad(form)
                    t0 = time.perf_counter()
                    jax.block_until_ready(f(q, k, v, w))
                    row[f"{name}_first_call_s"] = time.perf_counter() - t0
                    row[f"{name}_s"] = _median_time(f, (q, k, v, w), repeats, warmup)
                    if name == "softmax":
                        baseline = {k_: row[k_] for k_ in ("softmax_first_call_s", "softmax_s")}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def memory(methods, lengths, d, heads):
    rows = []
    for n in lengths:
        for method in methods:
            q, k, v, w, kwargs = _inputs(method, n, heads, d)
            f = _loss_grad(_forms(method, kwargs)["chunked"])
            rows.append({"method": method, "n": n, "head_dim": d,
                         "bytes": _memory_bytes(f, (q, k, v, w)),
                         "input_bytes": 4 * q.size * 4})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def decode(methods, contexts, d, heads, repeats, warmup):
    rows = []
    for method in methods:
        for n in contexts:
            q, k, v, _, kwargs = _inputs(method, n + 1, heads, d)
            spec = sa.get_attention_spec(method)
            tokens = {a for a, _, _ in spec.token_arrays if a in kwargs}
            fixed = {a: x for a, x in kwargs.items() if a not in tokens}
            prompt = {a: kwargs[a][:n] for a in tokens}
            step_args = {a: kwargs[a][n:n + 1] for a in tokens}
            _, state = sa.prefill(method, q[:, :n], k[:, :n], v[:, :n], max_length=n + 1,
                                  **fixed, **prompt)
            step = jax.jit(lambda s, q1, k1, v1, t, fixed=fixed: sa.decode_step(
                s, q1, k1, v1, **fixed, **t))
            args = (state, q[:, n:], k[:, n:], v[:, n:], step_args)
            rows.append({"method": method, "context": n,
                         "step_s": _median_time(step, args, repeats, warmup),
                         "state_bytes": state.nbytes})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _table(rows, columns, header):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(c(row)) for c in columns) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(FAMILY))
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--forms", nargs="+", default=["chunked", "scan", "softmax"])
    parser.add_argument("--memory-lengths", nargs="+", type=int, default=[4096, 16384, 65536])
    parser.add_argument("--context", nargs="+", type=int, default=[256, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()

    results = {
        "device": str(jax.devices()[0]), "heads": args.heads, "batch": 1, "dtype": "float32",
        "speed": speed(args.methods, args.lengths, args.head_dims, args.heads, args.repeats,
                       args.warmup, args.forms),
        "memory": memory(args.methods, args.memory_lengths, 64, args.heads),
        "decode": decode(args.methods, args.context, 64, args.heads, args.repeats * 10,
                         args.warmup),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    f2 = lambda x: f"{x:.3g}"  # noqa: E731
    speed_table = _table(
        results["speed"],
        [lambda r: f"`{r['method']}`", lambda r: r["n"], lambda r: r["head_dim"],
         lambda r: f2(r.get("chunked_s", np.nan)), lambda r: f2(r.get("scan_s", np.nan)),
         lambda r: f2(r.get("softmax_s", np.nan)),
         lambda r: f2(r.get("scan_s", np.nan) / r["chunked_s"]),
         lambda r: f2(r.get("softmax_s", np.nan) / r["chunked_s"])],
        ["method", "n", "head dim", "chunked (s)", "scan (s)", "softmax (s)",
         "scan / chunked", "softmax / chunked"])
    mem_table = _table(
        results["memory"],
        [lambda r: f"`{r['method']}`", lambda r: r["n"], lambda r: f2(r["bytes"] / 2**20),
         lambda r: f2(r["bytes"] / r["n"] / 1024)],
        ["method", "n", "XLA fwd+bwd memory (MiB)", "KiB per token"])
    dec_table = _table(
        results["decode"],
        [lambda r: f"`{r['method']}`", lambda r: r["context"],
         lambda r: f2(r["step_s"] * 1e3), lambda r: r["state_bytes"]],
        ["method", "context", "decode step (ms)", "state (bytes)"])
    (args.out / "results.md").write_text(
        f"Device: {results['device']}; batch 1, {args.heads} heads, float32.\n\n"
        f"## Forward + backward\n\n{speed_table}\n\n## Memory\n\n{mem_table}\n\n"
        f"## Decode\n\n{dec_table}\n")
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
