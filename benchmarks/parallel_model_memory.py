"""Per-device peak memory of a whole model's forward and gradients on a split sequence.

A 2-layer Nyströmformer SequenceClassifier (width 64, 32 landmarks) at n = 8192, batch 2,
compiled (nothing runs) on 1 device, on 2 devices (data parallel) and on a (data=2, seq=4)
mesh under ``split_sequence``: whether XLA keeps the layers around attention split over the
sequence too (then the 8-device figure is about 1/8 of the 1-device one).

    python benchmarks/parallel_model_memory.py
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before JAX starts its backend

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from spectral_jax.lra.compiled import peak_bytes  # noqa: E402
from spectral_jax.nn import SequenceClassifier, TransformerConfig  # noqa: E402
from spectral_jax.parallel import split_sequence  # noqa: E402

LENGTH, BATCH = 8192, 2


def peak_per_device(devices: int, seq: int) -> float:
    """MiB per device of the compiled forward and parameter gradients."""
    cfg = TransformerConfig(
        vocab_size=11, num_classes=3, max_length=LENGTH, num_layers=2, embed_dim=64,
        num_heads=2, qkv_dim=64, mlp_dim=128, dropout_rate=0.0, attention="nystrom",
        attention_kwargs=(("num_landmarks", 32),))
    graphdef, params, rest = nnx.split(SequenceClassifier(cfg, rngs=nnx.Rngs(0)), nnx.Param,
                                       ...)
    mesh = jax.make_mesh((devices // seq, seq), ("data", "seq"),
                         axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:devices])

    def loss(params, ids, mask):
        logits = nnx.merge(graphdef, params, rest)(ids, mask, deterministic=True)
        labels = jnp.zeros(BATCH, jnp.int32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(params, ids, mask):
        if seq == 1:
            return jax.value_and_grad(loss)(params, ids, mask)
        with split_sequence(mesh, batch_axis="data"):
            return jax.value_and_grad(loss)(params, ids, mask)

    with jax.set_mesh(mesh):
        batch = NamedSharding(mesh, P("data"))
        ids = jax.ShapeDtypeStruct((BATCH, LENGTH), jnp.int32, sharding=batch)
        mask = jax.ShapeDtypeStruct((BATCH, LENGTH), bool, sharding=batch)
        replicated = NamedSharding(mesh, P())
        shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params)
        return peak_bytes(jax.jit(step).lower(shapes, ids, mask).compile()) / 2**20


if __name__ == "__main__":
    for devices, seq in ((1, 1), (2, 1), (8, 4)):
        print(f"{devices} device(s), seq={seq}: {peak_per_device(devices, seq):.1f} MiB per "
              "device")
