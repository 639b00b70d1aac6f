"""Spectral shifting's δ estimates side by side: output error and operation count per form.

Forms, all of ``spectral_shift_attention``: ``paired`` (δ from s sampled diagonal rows,
numerator and denominator from the same rows, O(s·m²)), ``split`` (tr S from s sampled rows,
tr(F Z B) exact over all n rows, O(n·m²)), ``exact`` (every row, O(n²)) and ``zero``
(Nyströmformer); ``split`` samples s = m rows, ``paired`` its default max(32, m // 2) and
s = f·m for each ``--fractions`` f (m the landmark count). Inputs are ``bench error``'s
(the same seeds give the same q, k, v), so the paired default's per-seed errors are those of
``bench error --methods spectral_shift``. Each row gives the median over seeds and the seed
range.

``--cost-lengths`` adds XLA's forward+backward operation count (``bench speed``'s layout:
batch 1, 4 heads, head_dim 64, ``--cost-landmarks`` landmarks) of each form over
Nyströmformer's.

Usage:
    python benchmarks/spectral_shift_delta_forms.py --budgets 16 64 128 --seeds 0 1 2 \
        --fractions 0.25 0.5 1 --cost-lengths 4096 8192 16384 \
        --out benchmarks/spectral_shift_delta_forms
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import softmax_attention, spectral_shift_attention
from spectral_jax.lra.bench.error import relative_output_error
from spectral_jax.lra.bench.inputs import make_inputs
from spectral_jax.lra.compiled import compiled_cost

# (row label, bench error regime, sharpness): the README's spectral-shifting rows.
REGIMES = (
    ("sharp", "sharp", 2.0), ("sharpness 1.5", "sharp", 1.5), ("sharpness 1.0", "sharp", 1.0),
    ("diffuse", "diffuse", 2.0), ("random walk", "random_walk", 2.0),
    ("varying norm", "varying_norm", 2.0),
)


def forms(num_landmarks: int, fractions: list[float]) -> list[tuple[str, dict]]:
    """``(label, spectral_shift_attention keywords)`` for every form compared.

    ``split`` at its default s = m, ``paired`` at its default s = max(32, m // 2) and at
    s = max(1, round(f·m)) for each fraction f.
    """
    out = [("nystrom", {"shift": "zero"}),
           ("split s=m", {"shift": "split", "num_delta_rows": num_landmarks}),
           ("paired (default s)", {"shift": "paired"})]
    for f in fractions:
        s = max(1, round(f * num_landmarks))
        out.append((f"paired s={f:g}m", {"shift": "paired", "num_delta_rows": s}))
    return out + [("exact", {"shift": "exact"})]


def error_records(*, budgets, seeds, fractions, length=1024, heads=2, head_dim=64,
                  regimes=REGIMES):
    """One record per (regime, budget, form, seed): relative output error and mean δ."""
    records = []
    for label, regime, sharpness in regimes:
        for seed in seeds:
            # bench error's inputs: the first half of the seed's key split.
            input_rng = jax.random.split(jax.random.key(seed))[0]
            q, k, v = make_inputs(regime, input_rng, length=length, heads=heads,
                                  head_dim=head_dim, sharpness=sharpness)
            target = jax.jit(softmax_attention)(q, k, v)
            for m in budgets:
                for name, kw in forms(m, fractions):
                    fn = jax.jit(lambda q, k, v, kw=kw, m=m: spectral_shift_attention(
                        q, k, v, num_landmarks=m, **kw))
                    records.append({
                        "regime": label, "seed": seed, "budget": m, "form": name,
                        "output": relative_output_error(fn(q, k, v), target)})
    return records


def summary(records):
    """Median and [min, max] over seeds per (regime, budget, form), in first-seen order."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        groups.setdefault((r["regime"], r["budget"], r["form"]), []).append(r["output"])
    return [{"regime": g[0], "budget": g[1], "form": g[2], "median": float(np.median(x)),
             "min": float(np.min(x)), "max": float(np.max(x)), "seeds": len(x)}
            for g, x in groups.items()]


def fwd_bwd_gflop(kw: dict, length: int, num_landmarks: int, *, heads=4, head_dim=64):
    """XLA's forward+backward operation count (10⁹) of one form, all heads at once."""
    spec = jax.ShapeDtypeStruct((1, length, heads, head_dim), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(spectral_shift_attention(q, k, v, num_landmarks=num_landmarks, **kw))

    return compiled_cost(jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        spec, spec, spec).compile())[0]


def cost_rows(lengths, num_landmarks, fractions):
    rows = []
    for n in lengths:
        counts = {name: fwd_bwd_gflop(kw, n, num_landmarks)
                  for name, kw in forms(num_landmarks, fractions) if name != "exact"}
        rows += [{"length": n, "form": name, "gflop": c, "over_nystrom": c / counts["nystrom"]}
                 for name, c in counts.items()]
    return rows


def markdown(rows, costs, budgets) -> str:
    names = list(dict.fromkeys(r["form"] for r in rows))
    by = {(r["regime"], r["budget"], r["form"]): r for r in rows}
    lines = ["| regime | landmarks | " + " | ".join(names) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in names) + " |"]
    for regime in dict.fromkeys(r["regime"] for r in rows):
        for m in budgets:
            cells = [by[(regime, m, f)] for f in names]
            lines.append(f"| {regime} | {m} | " + " | ".join(
                f"{c['median']:.4g} [{c['min']:.4g}, {c['max']:.4g}]" for c in cells) + " |")
    if costs:
        cnames = list(dict.fromkeys(c["form"] for c in costs))
        lines += ["", "| n | " + " | ".join(cnames) + " |",
                  "| ---: | " + " | ".join("---:" for _ in cnames) + " |"]
        for n in dict.fromkeys(c["length"] for c in costs):
            cells = {c["form"]: c for c in costs if c["length"] == n}
            lines.append(f"| {n} | " + " | ".join(
                f"{cells[f]['gflop']:.3g} ({cells[f]['over_nystrom']:.3f}×)" for f in cnames)
                + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--fractions", type=float, nargs="*", default=[],
                        help="paired form's sampled rows s as fractions of num_landmarks")
    parser.add_argument("--cost-lengths", type=int, nargs="*", default=[])
    parser.add_argument("--cost-landmarks", type=int, default=64)
    parser.add_argument("--out", default="bench_out/spectral_shift_delta_forms")
    args = parser.parse_args(argv)
    rows = summary(error_records(budgets=args.budgets, seeds=args.seeds,
                                 fractions=args.fractions, length=args.length))
    costs = cost_rows(args.cost_lengths, args.cost_landmarks, args.fractions)
    table = markdown(rows, costs, args.budgets)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"args": vars(args), "errors": rows, "costs": costs}, indent=1) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
