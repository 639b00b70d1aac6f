"""`bench dump-qkv`: capture one layer's queries, keys and values from a trained run."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

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
      ValueError: ``layer`` out of range (the message gives the number of layers).

    Example:
      >>> # see tests/test_bench_dump.py
    """
    from spectral_jax.nn import MultiHeadAttention

    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, MultiHeadAttention)]
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(layers):
        raise ValueError(f"`layer` must be an int in [0, {len(layers)}); got {layer!r}.")
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
      ValueError: bad ``split``, ``checkpoint``, ``layer`` or ``num_examples``.

    Example:
      >>> # spectral-jax bench dump-qkv --workdir runs/listops_quick --out qkv.npz
    """
    import ml_collections

    from spectral_jax import data
    from spectral_jax.train import checkpoint as checkpoint_lib
    from spectral_jax.train import distributed, loop
    from spectral_jax.train import steps as steps_lib

    if split not in ("train", "validation", "test"):
        raise ValueError(f"`split` must be train, validation or test; got {split!r}.")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"`num_examples` must be a positive int; got {num_examples!r}.")
    path = os.path.join(workdir, loop.CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no run in workdir={workdir!r} ({loop.CONFIG_FILE} is missing)")
    with open(path) as f:
        config = ml_collections.ConfigDict(json.load(f))
    loop.validate_config(config)
    task = loop._load_task(config, True)  # noqa: SLF001  (no public loader yet)
    model_cfg = steps_lib.model_config(config, task)
    mesh = distributed.make_mesh()
    with jax.set_mesh(mesh):
        setup = loop.setup_run(config, model_cfg, task.dual, mesh)
        ckpt = checkpoint_lib.Checkpointer(
            os.path.join(workdir, loop.CHECKPOINT_DIR), keep=config.train.keep_checkpoints
        )
        try:
            step = ckpt.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {workdir!r}")
            if checkpoint not in ("best", "latest"):
                try:
                    step = int(checkpoint)
                except ValueError:
                    raise ValueError(f"`checkpoint` must be 'best', 'latest' or a step number; "
                                     f"got {checkpoint!r}.") from None
            state, meta = ckpt.restore(step, setup.state)
            if checkpoint == "best" and int(meta["best_step"]) != step:
                state, _ = ckpt.restore(int(meta["best_step"]), setup.state)
        finally:
            ckpt.close()
        model = nnx.merge(setup.graphdef, setup.rng_state, state)[0]
    batch = next(iter(data.iterate_batches(task.splits[split], num_examples, shuffle=False)))
    arrays = capture_qkv(model, layer, np.asarray(batch["inputs"]), np.asarray(batch["mask"]))
    out_path = pathlib.Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_path, **arrays)
    return out_path
