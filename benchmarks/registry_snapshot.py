"""Bitwise snapshot of every registered attention method, to check that a refactor changes nothing.

For each method in ``spectral_jax.attention.available_attentions()`` it records, on fixed
float32 inputs with and without a key padding mask:

- the pure function's output and the gradients of a fixed scalar function of it with respect
  to query, key and value, at the method's config defaults (budgets capped at the length) and
  with its state drawn from a fixed key by ``spectral_jax.lra.bench.methods.make_state``;
- ``spectral_jax.nn.MultiHeadAttention`` (``nnx.Rngs(0)``) output and input gradient for each
  module option set the method accepts (conv skip, Linformer sharing modes), before and after
  ``redraw_features``, in evaluation and training mode (fixed rng streams);
- every decode form: ``prefill`` of a right-padded prompt, then ``decode_step`` token by
  token (the prompt's outputs, each step's output and the final state's arrays);
- every sequence-parallel form on 8 simulated CPU devices (``sequence_parallel``): output
  and gradients, bidirectional and causal where the method has them, with padding lengths.

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
from spectral_jax.parallel import sequence_parallel

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


def _raw_kwargs(name: str, heads: int = H) -> tuple[dict, dict]:
    """The method's parameters and state at its test budget, and its per-token arrays
    ``(B, N, heads, ...)`` (gates, step sizes) apart."""
    spec = attention_lib.get_attention_spec(name)
    kwargs = spec.call_kwargs(jax.random.key(42), budget=spec.test_budget, length=N, head_dim=D)
    tokens = {}
    for arg, axis, batched in spec.token_arrays:
        if batched and arg in kwargs:
            x = kwargs.pop(arg)
            tokens[arg] = jnp.broadcast_to(x, (B, N, heads, *x.shape[x.ndim + axis + 2:]))
    return kwargs, tokens


def _decode_records(name: str) -> dict[str, np.ndarray]:
    spec = attention_lib.get_attention_spec(name)
    if spec.decode is None:
        return {}
    q, k, v, *_ = inputs()
    kwargs, tokens = _raw_kwargs(name)
    kwargs.pop("chunk_size", None)
    prompt = N // 2
    lengths = jnp.array([prompt, prompt - 7])

    @jax.jit
    def run(q, k, v, tokens):
        out, state = attention_lib.prefill(
            name, q[:, :prompt], k[:, :prompt], v[:, :prompt], max_length=N, lengths=lengths,
            **kwargs, **{n: x[:, :prompt] for n, x in tokens.items()})
        steps = []
        for t in range(8):
            take = lambda x, at=lengths + t: jnp.take_along_axis(  # noqa: E731
                x, at.reshape(B, 1, *(1,) * (x.ndim - 2)), axis=1)
            y, state = attention_lib.decode_step(
                state, take(q), take(k), take(v), **kwargs,
                **{n: take(x) for n, x in tokens.items()})
            steps.append(y)
        return out, jnp.concatenate(steps, 1), state.arrays

    out, steps, arrays = run(q, k, v, tokens)
    records = {f"decode/{name}/prefill": np.asarray(out), f"decode/{name}/steps": np.asarray(steps)}
    records.update({f"decode/{name}/state/{n}": np.asarray(a) for n, a in arrays.items()})
    return records


def _shard_records(name: str) -> dict[str, np.ndarray]:
    spec = attention_lib.get_attention_spec(name)
    if spec.sequence_parallel is None:
        return {}
    q, k, v, weights, *_ = inputs()
    kwargs, tokens = _raw_kwargs(name)
    lengths = jnp.array([N, N - 21])
    mesh = jax.make_mesh((8,), ("seq",), devices=jax.devices()[:8])
    fn = sequence_parallel(name, mesh=mesh)
    records = {}
    for causal in ([False] if not spec.causal_only else []) + ([True] if spec.supports_causal
                                                                else []):
        def loss(q, k, v, causal=causal):
            out = fn(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                     **({"is_causal": True} if causal else {}), **kwargs, **tokens)
            return jnp.sum(out * weights), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
            q, k, v)
        tag = "causal" if causal else "full"
        records[f"shard/{name}/{tag}/out"] = np.asarray(out)
        for g_name, g in zip("qkv", grads):
            records[f"shard/{name}/{tag}/grad_{g_name}"] = np.asarray(g)
    return records


def snapshot() -> dict[str, np.ndarray]:
    records = {}
    for name in attention_lib.available_attentions():
        records.update(_function_records(name))
        records.update(_module_records(name))
        records.update(_decode_records(name))
        records.update(_shard_records(name))
    return records


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("save", "compare"):
        print(__doc__)
        return 2
    jax.config.update("jax_num_cpu_devices", 8)  # the shard forms' devices, before any array
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
