"""What grouped-query heads save: XLA's operation count and memory, grouped vs repeated.

For every method with a grouped form, the forward pass at ``--length`` tokens, ``--heads``
query heads and head dim ``--head-dim`` is compiled twice: with ``--heads / --groups`` key and
value heads (grouped: what the method computes from keys alone is done once per key/value
head) and with those heads repeated to ``--heads`` (the same output, every head computed).
The ratio grouped / repeated of XLA's cost analysis (FLOP) and memory analysis (bytes) needs
no run and no quiet machine. A ratio near 1 says the method's work is mostly per query
(softmax, whose logits are per query head); the part computed from keys alone (landmarks,
features, projections, states) is what falls by ``--groups``. That part alone is the
"key side" column: the same ratio for one query against the ``--length`` keys, where the
per-query work is 1/``--length`` of the whole (blank where a method needs as many queries as
keys: spectral shifting, the causal-only ones).

A second table does the same for one decoding step (``decode_step`` after a prompt of
``--length`` tokens, cache of ``--cache-length``) of every decode form with grouped heads:
the state's bytes and the compiled step's peak memory (XLA), grouped / repeated.

A third table splits the sequence over ``--devices`` simulated CPU devices
(:func:`spectral_jax.parallel.sequence_parallel`) and counts the elements of the compiled
forward pass's collectives, grouped / repeated: 1/``--groups`` where only key/value data
crosses the devices (ring, feature sums, halo), more where per-query summaries cross too.

Usage::

    python benchmarks/grouped_heads_cost.py --out benchmarks/grouped_heads_cost.md
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.attention import ATTENTIONS, DECODE_FORMS, decode_step, prefill
from spectral_jax.lra.compiled import collectives, compiled_cost, peak_bytes
from spectral_jax.parallel import sequence_parallel

# The recurrent family's grouped form keeps a state per value head (its own semantics, not
# repeated keys).
SKIP = ()


def _step(state, q, k, v, *, kwargs):
    return decode_step(state, q, k, v, **kwargs)


def _compiled(fn, q, k, v):
    return jax.jit(fn).lower(q, k, v).compile()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--budget", type=int, default=64,
                        help="landmarks, features, clusters, ... of every method")
    parser.add_argument("--cache-length", type=int, default=4096)
    parser.add_argument("--devices", type=int, default=4,
                        help="simulated CPU devices the sequence is split over")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    jax.config.update("jax_num_cpu_devices", args.devices)  # before any computation
    n, h, d = args.length, args.heads, args.head_dim
    kv_heads = h // args.groups
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (1, n, h, d))
    k, v = (jax.random.normal(kk, (1, n, kv_heads, d)) for kk in ks[1:])
    rep = functools.partial(jnp.repeat, repeats=args.groups, axis=-2)
    rows = ["| method | GFLOP grouped | GFLOP repeated | ratio | memory ratio | key side |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, spec in ATTENTIONS.items():
        if name in SKIP or ".recurrent." in spec.fn.__module__:
            continue
        kwargs = spec.call_kwargs(jax.random.key(1), budget=args.budget, length=n, head_dim=d)
        fn = functools.partial(spec.fn, **kwargs)
        grouped = _compiled(fn, q, k, v)
        repeated = _compiled(fn, q, rep(k), rep(v))
        fg, fr = compiled_cost(grouped)[0], compiled_cost(repeated)[0]
        mg, mr = peak_bytes(grouped), peak_bytes(repeated)
        key_side = ""
        try:  # one query: what remains is the work on the keys
            one = [compiled_cost(_compiled(fn, q[:, :1], kk, vv))[0]
                   for kk, vv in ((k, v), (rep(k), rep(v)))]
            key_side = f"{one[0] / one[1]:.3f}"
        except (UsageError, UnsupportedError):  # a method that needs q_len == kv_len
            pass
        rows.append(f"| `{name}` | {fg:.3f} | {fr:.3f} | {fg / fr:.2f} | {mg / mr:.2f} | "
                    f"{key_side} |")
        print(rows[-1], flush=True)
    rows += ["", f"Decoding: one step after a {n}-token prompt, cache of {args.cache_length}.",
             "", "| method | state MiB grouped | state MiB repeated | state ratio "
             "| step peak ratio |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, spec in ATTENTIONS.items():
        if spec.decode is None or not DECODE_FORMS[spec.decode].grouped:
            continue
        kwargs = spec.call_kwargs(jax.random.key(1), budget=args.budget, length=n, head_dim=d)
        tokens = {}  # per-token gates, one row per key/value head
        for arg, axis, batched in spec.token_arrays:
            if batched and arg in kwargs:
                x = kwargs.pop(arg)
                tokens[arg] = jnp.broadcast_to(x, (1, n, kv_heads, *x.shape[x.ndim + axis + 2:]))
        sizes, peaks = [], []
        for keys, values, extra in ((k, v, tokens),
                                    (rep(k), rep(v), {a: jnp.repeat(x, args.groups, axis=2)
                                                      for a, x in tokens.items()})):
            _, state = prefill(name, q, keys, values, max_length=args.cache_length, **kwargs,
                               **extra)
            one = {a: x[:, :1] for a, x in extra.items()}
            step = jax.jit(functools.partial(_step, kwargs={**kwargs, **one}))
            sizes.append(state.nbytes)
            peaks.append(peak_bytes(step.lower(state, q[:, :1], keys[:, :1],
                                               values[:, :1]).compile()))
        rows.append(f"| `{name}` | {sizes[0] / 2**20:.2f} | {sizes[1] / 2**20:.2f} | "
                    f"{sizes[0] / sizes[1]:.3f} | {peaks[0] / peaks[1]:.3f} |")
        print(rows[-1], flush=True)
    rows += _sequence_parallel_rows(args, q, k, v, rep)
    text = (f"Forward pass, length {n}, {h} query heads, {kv_heads} key/value heads "
            f"(H_q / H_kv = {args.groups}), head dim {d}, batch 1, float32, "
            f"{jax.default_backend()}; budget (landmarks, features, projection length, "
            f"clusters) {args.budget}.\n\n"
            + "\n".join(rows) + "\n")
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


def _sequence_parallel_rows(args, q, k, v, rep) -> list[str]:
    mesh = jax.make_mesh((args.devices,), ("seq",), devices=jax.devices("cpu")[:args.devices])
    rows = ["", f"Sequence parallelism: the forward pass split over {args.devices} devices; "
            "elements in its collectives.", "",
            "| method | form | grouped | repeated | ratio |", "| --- | --- | ---: | ---: | ---: |"]
    n, d = q.shape[-3], q.shape[-1]
    for name, spec in ATTENTIONS.items():
        if name in SKIP or ".recurrent." in spec.fn.__module__ or spec.sequence_parallel is None:
            continue
        kwargs = spec.call_kwargs(jax.random.key(1), budget=args.budget, length=n, head_dim=d)
        fn = sequence_parallel(name, mesh=mesh, **kwargs)
        sizes = [sum(c.size for c in collectives(_compiled(fn, q, keys, values)))
                 for keys, values in ((k, v), (rep(k), rep(v)))]
        rows.append(f"| `{name}` | {spec.sequence_parallel} | {sizes[0]:,} | {sizes[1]:,} | "
                    f"{sizes[0] / sizes[1]:.3f} |")
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
