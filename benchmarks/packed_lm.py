"""Packed against padded training of the byte language model, in one run.

Documents are the paragraphs of the licenses corpus (``/usr/share/common-licenses``, see
``spectral_jax.lra.data.bytes_lm``), cut into pieces of at most ``length + 1`` bytes. Padded:
one piece per row, padded to ``length``. Packed: pieces packed first fit
(``spectral_jax.lra.data.packing.pack``) with segment ids and positions, as the
``bytes_docs`` task lays them out. The same model,
optimiser and batch shape train on each layout for the same number of steps; the figure is
real (non-padding) target tokens per second, and the padding fraction of each layout.

    python benchmarks/packed_lm.py --methods softmax linear gla --out benchmarks/packed_lm.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spectral_jax.lra.data import bytes_docs
from spectral_jax.lra.data.bytes_lm import LICENSES_DIR, read_corpus
from spectral_jax.lra.data.task import IGNORE_INDEX
from spectral_jax.nn import CausalLM, TransformerConfig


def layouts(length: int) -> tuple[int, dict[str, dict[str, np.ndarray]]]:
    """The corpus's paragraph pieces (``spectral_jax.lra.data.bytes_docs``), one per row and
    packed: the number of pieces and each layout's arrays."""
    raw, _ = read_corpus(LICENSES_DIR, "folder")
    docs = bytes_docs.pieces(raw, length)
    out = {}
    for name, packed in (("padded", False), ("packed", True)):
        split = bytes_docs.rows(docs, length, packed)
        out[name] = {"inputs": split.inputs, "targets": split.targets}
        if packed:
            out[name].update(segment_ids=split.segment_ids, positions=split.positions)
    return len(docs), out


def time_training(method: str, data: dict[str, np.ndarray], *, batch: int, steps: int,
                  length: int) -> tuple[float, float]:
    """Median seconds per step after a compiled warm-up, and the final training loss."""
    config = TransformerConfig(vocab_size=257, num_classes=257, max_length=length,
                               num_layers=2, embed_dim=128, num_heads=4, qkv_dim=128,
                               mlp_dim=256, is_causal=True, attention=method,
                               positional="rope", dropout_rate=0.0)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, rows):
        def loss_fn(model):
            extra = {k: rows[k] for k in ("segment_ids", "positions") if k in rows}
            logits = model(rows["inputs"], **extra)
            scored = rows["targets"] != IGNORE_INDEX
            losses = optax.softmax_cross_entropy_with_integer_labels(
                logits, jnp.where(scored, rows["targets"], 0))
            return jnp.sum(losses * scored) / jnp.maximum(scored.sum(), 1)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    rows = len(data["inputs"])
    times, loss = [], None
    for k in range(steps + 1):
        index = np.arange(k * batch, (k + 1) * batch) % rows
        chunk = {name: jnp.asarray(a[index]) for name, a in data.items()}
        start = time.perf_counter()
        loss = float(step(model, optimizer, chunk))
        if k:  # step 0 compiles
            times.append(time.perf_counter() - start)
    return statistics.median(times), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["softmax", "linear", "gla"])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    count, data = layouts(args.length)
    lines = [f"# Packed vs padded byte-LM training ({count} documents, rows of "
             f"{args.length}, batch {args.batch}, {args.steps} steps, {jax.default_backend()})",
             "", "| method | layout | rows | padding | ms/step | real tokens/s | packed/padded |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for method in args.methods:
        rates = {}
        for name, layout in data.items():
            seconds, _ = time_training(method, layout, batch=args.batch, steps=args.steps,
                                       length=args.length)
            real = float(np.mean(layout["targets"] != IGNORE_INDEX))
            rates[name] = real * args.batch * args.length / seconds
            ratio = "" if name == "padded" else f"{rates['packed'] / rates['padded']:.2f}×"
            lines.append(f"| {method} | {name} | {len(layout['inputs'])} | {1 - real:.1%} | "
                         f"{1e3 * seconds:.1f} | {rates[name]:,.0f} | {ratio} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
