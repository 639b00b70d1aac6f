"""Bitwise snapshot of every registered attention method, to check that a refactor changes nothing.

For each method in ``spectral_jax.attention.available_attentions()`` it records, on fixed
float32 inputs with and without a key padding mask:

- the pure function's output and the gradients of a fixed scalar function of it with respect
  to query, key and value, at the method's config defaults (budgets capped at the length) and
  with its state drawn from a fixed key by ``spectral_jax.lra.bench.methods.make_state``;
- ``spectral_jax.nn.MultiHeadAttention`` (``nnx.Rngs(0)``) output and input gradient for each
  module option set the method accepts (conv skip, Linformer sharing modes), before and after
  ``redraw_features``, in evaluation and training mode (fixed rng streams).

Usage::

    python benchmarks/registry_snapshot.py save BEFORE.npz
    python benchmarks/registry_snapshot.py compare BEFORE.npz   # exit 1 on any difference
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spectral_jax import attention as attention_lib
from spectral_jax import nn as nn_lib
from spectral_jax.lra.bench import methods as methods_lib
from spectral_jax.lra.train import config_lib

B, N, H, D = 2, 64, 2, 8
E = H * D
# Module option sets tried on every method; those a method refuses are skipped.
MODULE_OPTIONS = ({}, {"conv_kernel_size": 3}, {"sharing": "key_value"}, {"sharing": "layerwise"})


def inputs():
    k = jax.random.split(jax.random.key(0), 5)
    q, key, v = (jax.random.normal(k[i], (B, N, H, D)) for i in range(3))
    weights = jax.random.normal(k[3], (B, N, H, D))
    valid = jnp.arange(N)[None, :] < jnp.array([[N], [N - 21]])
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    return q, key, v, weights, valid, mask


def bound_method(name: str, length: int = N, head_dim: int = D):
    """name's pure function at its config defaults (budget capped at length), and its state."""
    kwargs = config_lib.attention_kwargs(name, max_length=length)
    param = methods_lib.BUDGET_PARAMS[name]
    budget = kwargs.pop(param) if param is not None else None
    if param is not None and budget is None:
        budget = 16
    state = methods_lib.make_state(name, jax.random.key(42), budget=budget, length=length,
                                   head_dim=head_dim)
    return methods_lib.bind(name, budget, **kwargs), state


def _function_records(name: str) -> dict[str, np.ndarray]:
    q, k, v, weights, _, mask = inputs()
    fn, state = bound_method(name)
    out = {}
    for tag, m in (("nomask", None), ("mask", mask)):
        def loss(q, k, v, m=m):
            return jnp.sum(fn(q, k, v, state, mask=m) * weights)

        y = jax.jit(lambda q, k, v, m=m: fn(q, k, v, state, mask=m))(q, k, v)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        out[f"fn/{name}/{tag}/out"] = np.asarray(y)
        for g_name, g in zip("qkv", grads):
            out[f"fn/{name}/{tag}/grad_{g_name}"] = np.asarray(g)
    return out


def _module_records(name: str) -> dict[str, np.ndarray]:
    x = jax.random.normal(jax.random.key(1), (B, N, E))
    _, _, _, _, valid, mask = inputs()
    defaults = config_lib.attention_kwargs(name, max_length=N)
    out = {}
    for i, options in enumerate(MODULE_OPTIONS):
        kwargs = {**defaults, **options}
        config = nn_lib.TransformerConfig(
            vocab_size=11, num_classes=3, max_length=N, num_layers=2, embed_dim=E,
            num_heads=H, qkv_dim=E, mlp_dim=32, dropout_rate=0.1, attention=name,
            attention_kwargs=tuple(sorted(kwargs.items())),
            is_causal=attention_lib.get_attention_spec(name).causal_only)
        try:
            model = nn_lib.SequenceClassifier(
                config, rngs=nnx.Rngs(0, dropout=1, landmarks=2, features=3))
        except ValueError:
            continue
        tokens = jax.random.randint(jax.random.key(4), (B, N), 1, 11)
        for tag, det in (("eval", True), ("train", False)):
            logits = model(tokens, valid, deterministic=det)
            out[f"module/{name}/{i}/{tag}/logits"] = np.asarray(logits)
        if options.get("sharing") == "layerwise":
            continue  # a lone layer has no encoder to own the shared projection
        single = None
        for extra in ({}, {"max_length": N}):  # Linformer's modules need the key length
            try:
                single = nn_lib.MultiHeadAttention(
                    H, E, attention=name, attention_kwargs={**kwargs, **extra},
                    is_causal=attention_lib.get_attention_spec(name).causal_only,
                    rngs=nnx.Rngs(0))
                break
            except ValueError:
                pass
        if single is None:
            continue
        for tag, m in (("nomask", None), ("mask", mask)):
            def loss(layer, x, m=m):
                return jnp.sum(layer(x, mask=m, deterministic=True) ** 2)

            y = single(x, mask=m, deterministic=True)
            g = nnx.grad(loss, argnums=1)(single, x)
            out[f"module/{name}/{i}/single/{tag}/out"] = np.asarray(y)
            out[f"module/{name}/{i}/single/{tag}/grad_x"] = np.asarray(g)
        nn_lib.redraw_features(single, jax.random.key(9))
        out[f"module/{name}/{i}/single/redrawn"] = np.asarray(
            single(x, mask=mask, deterministic=True))
    return out


def snapshot() -> dict[str, np.ndarray]:
    records = {}
    for name in attention_lib.available_attentions():
        records.update(_function_records(name))
        records.update(_module_records(name))
    return records


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("save", "compare"):
        print(__doc__)
        return 2
    records = snapshot()
    if argv[1] == "save":
        np.savez(argv[2], **records)
        print(f"saved {len(records)} arrays to {argv[2]}")
        return 0
    before = dict(np.load(argv[2]))
    missing = sorted(set(before) - set(records))
    new = sorted(set(records) - set(before))
    differ = [k for k in sorted(set(before) & set(records))
              if before[k].shape != records[k].shape
              or before[k].tobytes() != records[k].tobytes()]
    print(f"{len(set(before) & set(records))} arrays compared, {len(differ)} differ, "
          f"{len(missing)} missing, {len(new)} new (not compared)")
    for k in differ[:20]:
        err = np.max(np.abs(before[k].astype(np.float64) - records[k].astype(np.float64)))
        print(f"  DIFFERS {k}: max abs diff {err:.3g}")
    for k in missing[:20]:
        print(f"  MISSING {k}")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
