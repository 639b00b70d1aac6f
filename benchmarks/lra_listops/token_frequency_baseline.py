"""The ListOps accuracy of a position-blind classifier: token frequencies and length only.

Each expression becomes the share of each token id in it plus its log length (18 numbers,
standardised on the training split); a softmax regression, or an MLP with one hidden ReLU
layer, is fitted on the whole training split by full-batch Adam (optax). No order and no
position enter, so it measures what a model can get without reading *where* a token is: on
LRA-generated data about 19%, close to the majority label, against about 38% for the first
operator (``first_operator_baseline.py``). A run that sits between the two has learned more
than token counts but not yet the outermost operator.

Usage:
    python benchmarks/lra_listops/token_frequency_baseline.py DATA_DIR [--hidden 0 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spectral_jax.lra.data.listops import SPLIT_FILES, read_tsv

NUM_CLASSES = 10


def features(ids: list[np.ndarray], vocab_size: int) -> np.ndarray:
    """``(len(ids), vocab_size + 1)`` float32: each token id's share of the sequence, log length."""
    shares = np.stack([np.bincount(s, minlength=vocab_size)[:vocab_size] / len(s) for s in ids])
    log_len = np.log([len(s) for s in ids])[:, None]
    return np.concatenate([shares, log_len], axis=1).astype(np.float32)


def fit(x: np.ndarray, y: np.ndarray, *, hidden: int, steps: int, learning_rate: float,
        seed: int = 0):
    """A predict function ``x -> labels`` fitted by full-batch Adam on cross-entropy.

    ``hidden=0`` is a softmax regression, else one hidden ReLU layer of that width. Inputs
    are standardised with the training split's mean and deviation (constant columns kept at
    zero), so one learning rate suits every split size.
    """
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 0, std, 1.0)

    def standardise(a):
        return (jnp.asarray(a) - mean) / std

    k1, k2 = jax.random.split(jax.random.key(seed))
    width = x.shape[1]
    if hidden:
        params = {"w1": jax.random.normal(k1, (width, hidden)) / np.sqrt(width),
                  "b1": jnp.zeros(hidden),
                  "w2": jax.random.normal(k2, (hidden, NUM_CLASSES)) / np.sqrt(hidden),
                  "b2": jnp.zeros(NUM_CLASSES)}
    else:
        params = {"w2": jnp.zeros((width, NUM_CLASSES)), "b2": jnp.zeros(NUM_CLASSES)}

    def logits(p, a):
        h = jax.nn.relu(a @ p["w1"] + p["b1"]) if hidden else a
        return h @ p["w2"] + p["b2"]

    opt = optax.adam(learning_rate)

    # The data are arguments, not closed-over constants, which XLA would try to fold.
    # One-hot targets: the integer-label gradient is a scatter XLA also tries to fold.
    @jax.jit
    def train(p, xs, labels):
        def loss(p):
            targets = jax.nn.one_hot(labels, NUM_CLASSES)
            return optax.softmax_cross_entropy(logits(p, xs), targets).mean()

        def step(carry, _):
            p, state = carry
            updates, state = opt.update(jax.grad(loss)(p), state)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(step, (p, opt.init(p)), None, length=steps)[0][0]

    params = train(params, standardise(x), jnp.asarray(y))
    return lambda a: np.asarray(jnp.argmax(logits(params, standardise(a)), axis=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--hidden", type=int, nargs="+", default=[0, 64],
                        help="hidden widths to fit; 0 = softmax regression (default: 0 64)")
    parser.add_argument("--steps", type=int, default=600, help="full-batch Adam steps")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--vocab-size", type=int, default=17)
    args = parser.parse_args()
    ids, labels = read_tsv(args.data_dir / SPLIT_FILES["train"])
    x = features(ids, args.vocab_size)
    held_out = {}
    for split in ("validation", "test"):
        split_ids, split_labels = read_tsv(args.data_dir / SPLIT_FILES[split])
        held_out[split] = features(split_ids, args.vocab_size), split_labels
    for hidden in args.hidden:
        predict = fit(x, labels, hidden=hidden, steps=args.steps,
                      learning_rate=args.learning_rate)
        model = "softmax regression" if hidden == 0 else f"MLP, {hidden} hidden"
        scores = [f"train {100 * np.mean(predict(x) == labels):.2f}%"]
        for split, (split_x, split_labels) in held_out.items():
            acc = np.mean(predict(split_x) == split_labels)
            scores.append(f"{split} {100 * acc:.2f}%")
        print(f"token frequencies, {model:<20} " + "  ".join(scores))


if __name__ == "__main__":
    main()
