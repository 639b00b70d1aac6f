"""`bench dump-qkv`: capture one layer's queries, keys and values from a trained run."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from spectral_jax import UsageError, _checks

Array = jax.Array


class _Recorder(nnx.Module):
    """Calls ``inner`` and hands its output to ``sink(name, output)``."""

    def __init__(self, inner: nnx.Module, name: str, sink: Callable[[str, Array], None]):
        self.inner = inner
        self.name = name
        self.sink = sink

    def __call__(self, x: Array) -> Array:
        y = self.inner(x)
        self.sink(self.name, y)
        return y


def capture_qkv(
    model: nnx.Module, layer: int, inputs: Array, mask: Array
) -> dict[str, np.ndarray]:
    """Runs ``model`` once (deterministic) and returns the q/k/v that attention layer sees.

    The ``layer``-th :class:`spectral_jax.nn.MultiHeadAttention` in graph order gets its
    query/key/value projections wrapped for the call (the model is modified in place and
    restored afterwards). A symmetric layer (key projection = query projection) reports the
    second query-projection call as the keys.

    Args:
      model: a classifier from :mod:`spectral_jax.nn` called as ``model(inputs, mask,
        deterministic=True)``.
      layer: index among the model's attention layers.
      inputs: int token ids ``(batch, n)``.
      mask: bool ``(batch, n)``, True at real tokens.

    Returns:
      ``{"query", "key", "value"}`` float32 ``(batch, n, heads, head_dim)`` from the first
      call of that layer, and ``"mask"`` bool ``(batch, n)``.

    Raises:
      spectral_jax.UsageError: ``layer`` out of range (the message gives the number of layers).

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from spectral_jax.nn import SequenceClassifier, TransformerConfig
      >>> cfg = TransformerConfig(vocab_size=8, num_classes=2, max_length=6, qkv_dim=8,
      ...                         embed_dim=8, mlp_dim=8)
      >>> model = SequenceClassifier(cfg, rngs=nnx.Rngs(0))
      >>> qkv = capture_qkv(model, 1, jnp.ones((2, 6), jnp.int32), jnp.ones((2, 6), bool))
      >>> qkv["query"].shape, qkv["mask"].shape
      ((2, 6, 2, 4), (2, 6))
    """
    from spectral_jax.nn import MultiHeadAttention

    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, MultiHeadAttention)]
    if _checks.nonnegative_int("capture_qkv", "layer", layer) >= len(layers):
        raise UsageError(_checks.message("capture_qkv", "layer", f"an int in [0, {len(layers)})",
                                         layer))
    mha = layers[layer]
    calls: dict[str, list[Array]] = {"query": [], "key": [], "value": []}
    names = [n for n in ("query", "key", "value") if getattr(mha, n) is not None]
    originals = {n: getattr(mha, n) for n in names}
    try:
        for n in names:
            setattr(mha, n, _Recorder(originals[n], n, lambda k, y: calls[k].append(y)))
        model(inputs, mask, deterministic=True)
    finally:
        for n in names:
            setattr(mha, n, originals[n])
    query = calls["query"][0]
    key = calls["key"][0] if calls["key"] else calls["query"][1]
    out = {"query": query, "key": key, "value": calls["value"][0]}
    out = {k: np.asarray(v, np.float32) for k, v in out.items()}
    out["mask"] = np.asarray(mask, bool).reshape(query.shape[:2])
    return out


def dump_qkv(
    workdir: str,
    out: str,
    *,
    layer: int = 0,
    num_examples: int = 4,
    split: str = "test",
    checkpoint: str = "best",
) -> pathlib.Path:
    """Writes ``out`` (.npz: query, key, value, mask) captured from a checkpoint of a run.

    The run's ``config.json`` rebuilds the model and data, the checkpoint is restored, and the
    first ``num_examples`` examples of ``split`` pass through the model once;
    :func:`capture_qkv` records attention layer ``layer``. ``bench error --qkv out`` then
    measures every method on these inputs.

    Args:
      workdir: a run directory written by ``spectral-jax train``.
      out: destination path (.npz).
      layer: attention layer index (0 = first encoder layer).
      num_examples: examples to capture (the batch axis).
      split: ``"train"``, ``"validation"`` or ``"test"``.
      checkpoint: ``"best"``, ``"latest"`` or a step number.

    Returns:
      The path written.

    Raises:
      FileNotFoundError: no run or checkpoint in ``workdir``.
      spectral_jax.UsageError: bad ``split``, ``checkpoint``, ``layer`` or ``num_examples``.

    Example:
      ``spectral-jax bench dump-qkv --workdir runs/listops_quick --out qkv.npz`` calls
      ``dump_qkv("runs/listops_quick", "qkv.npz")``; tests/test_bench_dump.py runs it.
    """
    from spectral_jax.lra import data
    from spectral_jax.lra.train import run as run_lib

    _checks.choice("dump_qkv", "split", split, data.SPLIT_NAMES)
    _checks.positive_int("dump_qkv", "num_examples", num_examples)
    run, state, _ = run_lib.restore_for_evaluation(workdir, checkpoint)
    model = nnx.merge(run.setup.graphdef, run.setup.rng_state, state)[0]
    task = run.task
    batch = next(iter(data.iterate_batches(task.splits[split], num_examples, shuffle=False)))
    arrays = capture_qkv(model, layer, np.asarray(batch["inputs"]), np.asarray(batch["mask"]))
    out_path = pathlib.Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_path, **arrays)
    return out_path
